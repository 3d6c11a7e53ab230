"""Keras `model.fit` as a Caramel job: one callback does what the job needs.

    model.compile(optimizer=ctf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss=...,
                  steps_per_execution=4)
    caramel = TrainingCallback(model, steps_per_epoch=100, epochs=5, batch_size=64)
    model.fit(data, epochs=5, steps_per_epoch=100, initial_epoch=caramel.initial_epoch,
              callbacks=[caramel], verbose=0)

The callback
- restores the latest checkpoint on rank 0 (when the job has `spec.checkpoint`) and broadcasts
  every weight and optimizer variable from rank 0, so all ranks start identical (Horovod's
  BroadcastGlobalVariablesCallback); `initial_epoch` is the epoch to resume at;
- runs Keras' own `train_step` through `caramel.tensorflow.function`: the `steps_per_execution`
  given to `compile` are unrolled in one graph (Keras' own loop finishes every step before the
  next starts), so each step's transfers overlap the next forward pass, and the transfer plan
  is re-made between executions as the link is measured;
- records Caramel's per-step metrics and logs progress lines from rank 0;
- checkpoints at the end of every epoch once `spec.checkpoint.intervalSteps` steps have passed
  since the last one, and at the end: Keras resumes at epoch boundaries only;
- at the end, checks that every rank holds the same weights.
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from caramel.tensorflow.ledger import Ledger
from caramel.tensorflow.steps import StepFunction


class TrainingCallback(tf.keras.callbacks.Callback):
    """Broadcast, scheduling, metrics, progress, checkpoints and resume for `model.fit`."""

    def __init__(self, model: tf.keras.Model, *, steps_per_epoch: int, epochs: int, batch_size: int) -> None:
        super().__init__()
        if model.optimizer is None or not model.built:
            raise ValueError("build the model and compile it (with ctf.DistributedOptimizer) before TrainingCallback")
        if steps_per_epoch < 1 or epochs < 1:
            raise ValueError(f"steps_per_epoch and epochs must be at least 1, got {steps_per_epoch} and {epochs}")
        # Keras counts the steps done in the optimizer's iterations, which checkpoints keep.
        self.ledger = Ledger(
            model, model.optimizer, model.optimizer.iterations, total_steps=steps_per_epoch * epochs, batch_size=batch_size
        )
        self.initial_epoch = self.ledger.completed_steps // steps_per_epoch
        """The epoch to pass to `fit` as initial_epoch: the one after the restored checkpoint's."""
        self._steps: StepFunction | None = None
        self._execution: tuple[float, list[Any]] = (0.0, [])

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._steps = StepFunction(
            self._keras_step, int(self.model._steps_per_execution.numpy()), unpack=False,
            total_steps=self.ledger.total_steps - self.ledger.completed_steps,
        )  # fmt: skip
        self.model.train_function = self._train_function

    def _keras_step(self, data: Any) -> Any:
        """Keras' own training step, counted once it has succeeded, as Keras counts it."""
        outputs = self.model.train_step(data)
        with tf.control_dependencies(tf.nest.flatten(outputs)[:1]):
            self.model._train_counter.assign_add(1)
        return outputs

    def _train_function(self, iterator: Any) -> Any:
        """What `fit` calls per execution: the steps Keras asks for, several per graph."""
        count = int(self.model._steps_per_execution.numpy())
        started = time.perf_counter()
        outputs = self._steps(iterator, count)
        self._execution = ((time.perf_counter() - started) / count, outputs)
        return outputs[-1]

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        seconds, outputs = self._execution
        times = self._steps.last_times or [None] * len(outputs)
        first = self.ledger.completed_steps - len(outputs) + 1
        for offset, (output, step_times) in enumerate(zip(outputs, times)):
            loss = float(output["loss"]) if "loss" in output else float("nan")
            self.ledger.record_step(first + offset, seconds, loss, step_times)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.ledger.checkpoint_if_due()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.ledger.finish()
