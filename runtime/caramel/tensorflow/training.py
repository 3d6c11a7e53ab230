"""The custom training loop's companion.

    ctf.init()
    run = TrainingRun(model, optimizer, total_steps=200, batch_size=64)
    run.fit(train_step, lambda step: batch(step))    # several steps per graph, resumable

`fit` runs an ordinary training step (`train_step(*batch) -> loss`) through
`caramel.tensorflow.function`, several steps per graph execution, so each step's transfers
overlap the next step's forward pass, and the plan is re-made as the link is measured. Loops
that call their own `tf.function` once per step use `for step in run.steps(): ...` instead;
their steps send the gradients exactly as Horovod's tape does (see communicator.py).

Either way the run resumes after the latest checkpoint, records metrics, logs progress and
checks at the end that every rank holds the same weights (see ledger.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from caramel.tensorflow.ledger import Ledger, say
from caramel.tensorflow.runtime import current
from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION, StepFunction


class TrainingRun:
    """One process's part of a training job run by a custom loop."""

    def __init__(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, *, total_steps: int, batch_size: int) -> None:
        if not model.built:
            raise ValueError("build the model (call it once or model.build(shape)) before TrainingRun")
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="caramel_step")
        self.runtime = current()
        self.runtime.drive(
            "TrainingRun",
            "an elastic script (hvd.elastic.run) keeps its own loop and commits its state; train either with hvd.elastic "
            "(its gang re-forms in the process, from the last commit) or with TrainingRun (its gang restarts from the checkpoint)",
        )
        self.ledger = Ledger(self.runtime, model, optimizer, counter, total_steps=total_steps, batch_size=batch_size)
        self.total_steps = total_steps
        self._pending_loss: float | None = None

    @property
    def completed_steps(self) -> int:
        """Steps done so far, restored ones included."""
        return self.ledger.completed_steps

    def fit(
        self,
        step: Callable[..., tf.Tensor],
        batches: Callable[[tf.Tensor], Any] | tf.data.Dataset,
        *,
        steps_per_execution: int = DEFAULT_STEPS_PER_EXECUTION,
    ) -> None:
        """Run the remaining steps, `steps_per_execution` per graph execution.

        `step(*batch)` is one training step returning its loss. `batches` is either a function
        of the (1-based, int64 tensor) step number returning that step's batch, so that a
        resumed run sees exactly the batches an uninterrupted run would, or a dataset yielding
        the batches of the remaining steps.
        """
        first = self.completed_steps + 1
        self._announce_nothing_to_do(first)
        if not isinstance(batches, tf.data.Dataset):
            batches = tf.data.Dataset.range(first, self.total_steps + 1).map(batches)
        iterator = iter(batches)
        steps = StepFunction(step, steps_per_execution, total_steps=self.total_steps - self.completed_steps)
        while self.completed_steps < self.total_steps:
            count = min(steps_per_execution, self.total_steps - self.completed_steps)
            started = time.perf_counter()
            losses = steps(iterator, count)
            seconds = (time.perf_counter() - started) / count
            first = self.completed_steps + 1
            self.ledger.counter.assign(first + count - 1)
            self.ledger.record_steps(first, seconds, [float(loss) for loss in losses], steps.last_times or [None] * count)
            # The variables hold the state after the execution's last step: checkpoint only here.
            self.ledger.checkpoint_if_due()
        self.ledger.finish()

    def report_loss(self, loss: Any) -> None:
        """The loss of the step just run in `steps()` (waits for the step to finish)."""
        self._pending_loss = float(loss)

    def steps(self) -> Iterator[int]:
        """Yield the step numbers still to run, 1-based, timing and recording each; every step
        must `report_loss`."""
        first = self.completed_steps + 1
        self._announce_nothing_to_do(first)
        for step in range(first, self.total_steps + 1):
            self._pending_loss = None
            started = time.perf_counter()
            yield step
            if self._pending_loss is None:
                raise RuntimeError("call report_loss(loss) in every step of TrainingRun.steps()")
            measured = self.runtime.communicator.measure(1)
            self.ledger.counter.assign(step)
            self.ledger.record_steps(step, time.perf_counter() - started, [self._pending_loss], measured or [None])
            self.ledger.checkpoint_if_due()
        self.ledger.finish()

    def _announce_nothing_to_do(self, first: int) -> None:
        if first > self.total_steps:
            say(f"nothing to do: already at step {self.completed_steps} of {self.total_steps}")
