"""The weights digest every rank compares at the end of a run (`caramel.tensorflow.ledger`)."""

from __future__ import annotations

import hashlib

import numpy as np
import tensorflow as tf

from caramel.tensorflow import ledger


def test_the_digest_is_the_sha256_of_the_weights_bytes_in_order(monkeypatch):
    monkeypatch.setattr(ledger, "DIGEST_SLICE_ELEMENTS", 5)  # several slices per weight, the last one partial
    values = [np.arange(12, dtype=np.float32).reshape(3, 4), np.float32(7.5), np.arange(3, dtype=np.int64), np.zeros([0], np.float32)]
    expected = hashlib.sha256(b"".join(np.ascontiguousarray(value).tobytes() for value in values)).hexdigest()
    assert ledger.weights_digest([tf.Variable(value) for value in values]) == expected
    changed = [tf.Variable(value) for value in values]
    changed[2].assign([0, 1, 3])  # one element of the last slice
    assert ledger.weights_digest(changed) != expected


def test_variables_each_rank_trains_on_its_own_are_left_out():
    shared, own = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    assert ledger.weights_digest([shared, own], leaving_out={id(own)}) == ledger.weights_digest([shared])
