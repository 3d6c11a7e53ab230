"""The tests' small model (testbed/small_model.py) trained through `ctf.function`, several steps
per execution, on each rank's own synthetic batches: what several test workers run before they
look at the outcome."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

import caramel.tensorflow as ctf
from testbed.small_model import DEFAULT_LEARNING_RATE, LOSS, batch, build_model, build_optimizer

# Executions run at most, waiting for the first plan to be decided: the steps of the small model
# take milliseconds, the plan's search, in a process of its own, about a second to start.
MAX_EXECUTIONS = 2000


def train_past_the_first_plan(
    steps_per_execution: int, on_trace: Callable[[], None] = lambda: None, total_steps: int | None = None, executions_after: int = 2
) -> tf.keras.Model:
    """Run executions of `steps_per_execution` steps until the first plan is decided (every rank
    decides at the same execution), then `executions_after` more; `on_trace` is called each time a
    step is traced into a graph; `total_steps`, if given, is what `ctf.function` is told the run
    will take. Returns the trained model."""
    runtime = ctf.init()
    model = build_model(8)
    optimizer = ctf.DistributedOptimizer(build_optimizer(DEFAULT_LEARNING_RATE))
    ctf.broadcast_variables(model.variables)

    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        on_trace()  # Python runs only while tracing
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    steps = ctf.function(step, steps_per_execution=steps_per_execution, total_steps=total_steps)
    data = iter(tf.data.Dataset.range(steps_per_execution * MAX_EXECUTIONS).map(lambda i: batch(i, ctf.rank(), 16)))
    executions = 0
    while not runtime.communicator.control.replanner.measured:
        if executions == MAX_EXECUTIONS:
            raise RuntimeError(f"no first plan after {MAX_EXECUTIONS} executions")
        steps(data)
        executions += 1
    for _ in range(executions_after):
        steps(data)
    return model
