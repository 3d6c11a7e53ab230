"""The tests' small model (testbed/small_model.py) trained through `ctf.function`, several steps
per execution, on each rank's own synthetic batches: what several test workers run before they
look at the outcome."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

import caramel.tensorflow as ctf
from testbed.small_model import DEFAULT_LEARNING_RATE, LOSS, batch, build_model, build_optimizer


def train(
    executions: int, steps_per_execution: int, on_trace: Callable[[], None] = lambda: None, say_total_steps: bool = False
) -> tf.keras.Model:
    """Run `executions` executions of `steps_per_execution` steps; `on_trace` is called each time
    a step is traced into a graph; with `say_total_steps`, `ctf.function` is told how many steps
    there are. Returns the trained model."""
    model = build_model(8)
    optimizer = ctf.DistributedOptimizer(build_optimizer(DEFAULT_LEARNING_RATE))
    ctf.broadcast_variables(model.variables)

    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        on_trace()  # Python runs only while tracing
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    total_steps = steps_per_execution * executions if say_total_steps else None
    steps = ctf.function(step, steps_per_execution=steps_per_execution, total_steps=total_steps)
    data = iter(tf.data.Dataset.range(steps_per_execution * executions).map(lambda i: batch(i, ctf.rank(), 16)))
    for _ in range(executions):
        steps(data)
    return model
