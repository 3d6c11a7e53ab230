"""The custom training loops the benchmark workers run, as a user of each API writes them.

    tape      a `tf.function` step, called once per step, averaging its gradients with a tape
              drop-in: plain Horovod's `hvd.DistributedGradientTape` (Horovod's TF2 examples; given
              the Keras 3 variables' `tf.Variable`s as sources, `plain_horovod.variables_of`), or
              `ctf.DistributedGradientTape` in the same script (import swapped), or a plain tape
              (compute-only); MultiWorkerMirroredStrategy's custom loop (`mwms.loop_step`) runs
              through `train_per_step` too;
    function  the same step through `ctf.function`, several steps per graph execution (Caramel's
              cross-iteration window), as `TrainingRun.fit` runs it.

Both time each step into a StepLog; an execution's steps share its time. A measured run stands
for the steady state of a long training (its planning policy's `long_training`, given when it
joins: joining.py); a run of a whole short job leaves every decision to the runtime, which is told
the job's length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks.worker_events import StepLog
from caramel.tensorflow import runtime
from caramel.tensorflow.steps import StepFunction

Tape = Callable[[tf.GradientTape], tf.GradientTape]
"""Wraps a tf.GradientTape into one whose gradient() averages over the ranks (or not)."""


def training_step(
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    tape: Tape,
    sources: Callable[[list], list] = list,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """An ordinary training step, averaging its gradients with `tape`; `sources` maps the model's
    trainable variables to what the tape differentiates against (Horovod's tape: their
    `tf.Variable`s)."""
    variables = model.trainable_variables

    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as plain:
            value = loss(labels, model(inputs, training=True))
        gradients = tape(plain).gradient(value, sources(variables))
        optimizer.apply_gradients(zip(gradients, variables))
        return value

    return train_step


def train_per_step(train_step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], batch: Callable[[int], tuple[tf.Tensor, tf.Tensor]], total: int, times: StepLog) -> None:
    """total steps, a tf.function call each, each timed from its batch's arrival to its end."""
    step_function = tf.function(train_step)
    for step in range(total):
        inputs, labels = batch(step)  # from the input pipeline, before the step's clock starts
        started = time.perf_counter()
        step_function(inputs, labels).numpy()  # the step has ended once its loss exists
        times.append(time.perf_counter() - started)


def train_in_executions(
    train_step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], data: tf.data.Dataset, total: int, steps_per_execution: int, times: StepLog
) -> None:
    """total steps through ctf.function, steps_per_execution per graph, from a prefetched input
    pipeline of (inputs, labels) batches; ctf.function knows there are `total`."""
    steps = cast(StepFunction, ctf.function(train_step, steps_per_execution=steps_per_execution, total_steps=total))  # given a step
    iterator = iter(data.prefetch(steps_per_execution))
    done = 0
    while done < total:
        count = min(steps_per_execution, total - done)
        started = time.perf_counter()
        losses = steps(iterator, count)
        float(losses[-1])  # the execution has ended once its last loss exists
        times.append(time.perf_counter() - started, count)
        done += count
