"""A training process for tests/tensorflow/test_retrace.py: step graphs traced through Caramel's optimizer
are freed once their function is dropped, as after a re-plan. Prints how many are still alive.

Two things once kept every traced graph alive, about 50 MB per step of an emulated ResNet-50:
the communicator's per-graph trace state (held in a mapping keyed weakly by the graph, whose
values held the graph's tensors), and Keras' gradient aggregation (tf.custom_gradient registers
a gradient function globally on every trace).
"""

from __future__ import annotations

import gc
import json
import weakref

import tensorflow as tf

import caramel.tensorflow as ctf
from testbed.small_model import DEFAULT_LEARNING_RATE, LOSS, batch, build_model, build_optimizer

TRACES = 3


def main() -> None:
    ctf.init()
    model = build_model(8)
    optimizer = ctf.DistributedOptimizer(build_optimizer(DEFAULT_LEARNING_RATE))

    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    features, labels = batch(1, ctf.rank(), 16)
    graphs = []
    for _ in range(TRACES):
        function = tf.function(step)
        graphs.append(weakref.ref(function.get_concrete_function(features, labels).graph))
        function(features, labels)
        del function
    gc.collect()
    print(json.dumps({"traced": TRACES, "alive": sum(graph() is not None for graph in graphs)}), flush=True)


if __name__ == "__main__":
    main()
