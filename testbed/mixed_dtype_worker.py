"""A training process for tests/tensorflow/test_correctness.py: the gradients of a float32 and a float16
variable, which the first plan puts in one transfer, averaged over the ranks through
`ctf.DistributedGradientTape` in a graph. Prints whether every rank got the exact average.

A Horovod collective moves one dtype: a transfer's pieces are averaged per dtype.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import caramel.tensorflow as ctf


def main() -> None:
    ctf.init()
    weights = [tf.Variable(tf.ones([5], tf.float32)), tf.Variable(tf.ones([3], tf.float16))]

    @tf.function
    def averaged_gradients() -> list[tf.Tensor]:
        scale = float(ctf.rank() + 1)  # rank r's gradient of each weight is r + 1 everywhere
        with tf.GradientTape() as tape:
            loss = scale * tf.reduce_sum(weights[0]) + scale * tf.reduce_sum(tf.cast(weights[1], tf.float32))
        return ctf.DistributedGradientTape(tape).gradient(loss, weights)

    expected = np.mean(np.arange(1, ctf.size() + 1))
    gradients = averaged_gradients()
    exact = [gradient.dtype.name for gradient in gradients if np.allclose(gradient.numpy().astype(np.float64), expected)]
    print(json.dumps({"exact_averages": exact}), flush=True)


if __name__ == "__main__":
    main()
