"""`ctf.function` given fewer batches than the steps it is asked for: a clear error that says
so, not TensorFlow's end-of-sequence from inside a graph (one real Horovod rank)."""

from __future__ import annotations

import sys

import pytest

from conftest import job_manifest, run_caramel, write_manifest

pytestmark = pytest.mark.e2e

SCRIPT = """
import tensorflow as tf
import caramel.tensorflow as ctf
ctf.init()
variable = tf.Variable(1.0)
optimizer = ctf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))

def step(x):
    with tf.GradientTape() as tape:
        loss = variable * x
    optimizer.apply_gradients([(tape.gradient(loss, variable), variable)])
    return loss

steps = ctf.function(step, steps_per_execution=4)
steps(iter(tf.data.Dataset.from_tensors(1.0).repeat(2)))
"""


def test_too_few_batches_for_an_execution_is_a_clear_error(tmp_path):
    # No restarts (backoffLimit 0): each would run out of data the same way.
    manifest = job_manifest(script=None, command=[sys.executable, "-c", SCRIPT], args=[], workers={"replicas": 1}, runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode != 0
    assert "the data ran out within an execution of" in result.stderr, result.stderr[-3000:]
    assert "give the iterator at least as many batches as steps" in result.stderr, result.stderr[-3000:]
