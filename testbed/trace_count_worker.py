"""A training process for tests/test_retrace.py: how many times `ctf.function` traces its graph
of several steps. Prints, for each graph the step was traced into, how many steps it holds.

A variable made while tf.function traces makes it trace the whole function a second time; the
stamps' variables once were, so every new plan traced its multi-step graph twice (four unrolled
steps of an emulated ResNet-50, 4 workers on 2 cores: the adopting execution took 75 s, now 49 s).
"""

from __future__ import annotations

import json
from collections import Counter

import tensorflow as tf

import caramel.tensorflow as ctf
from examples.train_small import DEFAULT_LEARNING_RATE, LOSS, batch, build_model, build_optimizer

STEPS_PER_EXECUTION = 4
EXECUTIONS = 3  # the first runs its steps one by one; the first measured plan comes in with the second


def main() -> None:
    ctf.init()
    model = build_model(8)
    optimizer = ctf.DistributedOptimizer(build_optimizer(DEFAULT_LEARNING_RATE))
    steps_per_graph: Counter[tf.Graph] = Counter()

    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        steps_per_graph[tf.compat.v1.get_default_graph()] += 1  # Python runs only while tracing
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    steps = ctf.function(step, steps_per_execution=STEPS_PER_EXECUTION)
    data = iter(tf.data.Dataset.range(STEPS_PER_EXECUTION * EXECUTIONS).map(lambda i: batch(i, ctf.rank(), 16)))
    for _ in range(EXECUTIONS):
        steps(data)
    print(json.dumps({"steps_per_traced_graph": sorted(steps_per_graph.values())}), flush=True)


if __name__ == "__main__":
    main()
