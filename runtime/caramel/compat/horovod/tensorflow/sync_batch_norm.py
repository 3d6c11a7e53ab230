"""Horovod's `SyncBatchNormalization` (`horovod.tensorflow.sync_batch_norm`), served by Caramel: batch
normalization whose batch statistics, in training, are those of every rank's batch together.

Each rank computes its batch's mean and mean of squares, and the layer normalizes with their
average over the ranks (as Horovod's does: the ranks' batches are taken to be of one size), from
which the variance is E[x^2] - E[x]^2; the moving statistics follow those averages, so they stay
the same on every rank. In inference the moving statistics are used, as by any batch
normalization. It is a layer of the Keras `tf.keras` is (Keras 3, or Keras 2 where the job asks
for it), whose moments method both Kerases call with their own arguments.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from caramel.collectives.backend import ReduceOp
from caramel.tensorflow.keras_version import keras_2
from horovod.tensorflow._caramel_collectives import backend


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Synchronous batch normalization: in training, the statistics of all ranks' batches."""

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")  # Horovod's own error
        kwargs.setdefault("name", "sync_batch_normalization")
        if keras_2():  # Keras 3 has no fused kernel to turn off
            kwargs["fused"] = False
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(inputs, *args, **kwargs)
        collectives = backend()
        if collectives.size == 1:
            return mean, variance
        stacked = tf.stack([mean, variance + tf.math.square(mean)])
        group_mean, group_mean_of_square = tf.unstack(collectives.all_reduce([stacked], ReduceOp.AVERAGE, "hvd_sync_batch_norm")[0])
        return group_mean, group_mean_of_square - tf.math.square(group_mean)


__all__ = ["SyncBatchNormalization"]
