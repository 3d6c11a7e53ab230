"""The training loop's companion: step timing, metrics, progress, checkpoints, final checks.

    contract = ctf.init()
    run = TrainingRun(model, optimizer, total_steps=200, batch_size=64)
    for step in run.steps():           # resumes after the latest checkpoint
        loss = train_step(batch(step))
        run.report_loss(loss)

Rank 0 restores the latest checkpoint and every rank starts from rank 0's variables, so all
ranks begin identical. At the end every rank prints a digest of its trainable weights, and the
run fails if any two ranks disagree.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.job.contract import WorkerContract
from caramel.metrics import StepRecord, WorkerMetrics
from caramel.job.progress import ProgressReport, format_report

# Rank 0 logs progress at most this often (and always on the first and last step).
PROGRESS_INTERVAL_SECONDS = 0.5
CHECKPOINTS_KEPT = 3


class TrainingRun:
    """One process's part of a training job."""

    def __init__(self, model: tf.keras.Model, optimizer: Any, *, total_steps: int, batch_size: int) -> None:
        if not model.built:
            raise ValueError("build the model (call it once or model.build(shape)) before TrainingRun")
        self.model = model
        self.total_steps = total_steps
        self.global_batch = batch_size * hvd.size()
        self.rank = hvd.rank()
        self._communicator = ctf.communicator()
        self._optimizer = getattr(optimizer, "inner", optimizer)
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="caramel_step")
        self._loss: float | None = None
        self._step_seconds: list[float] = []
        self._losses: list[float] = []
        self._last_progress = 0.0
        self.contract = WorkerContract.from_env()
        self.metrics = WorkerMetrics(self.rank)
        if self.contract.metrics_port:
            self.metrics.serve(self.contract.metrics_port)
        self._checkpoint_manager = self._restore_and_sync()
        self._last_saved_step = self.completed_steps

    @property
    def completed_steps(self) -> int:
        """Steps done so far, restored ones included."""
        return int(self._step.numpy())

    def _restore_and_sync(self) -> tf.train.CheckpointManager | None:
        # Optimizer state must exist before it can be restored or broadcast.
        if hasattr(self._optimizer, "build"):
            self._optimizer.build(self.model.trainable_variables)
        manager = None
        if self.contract.checkpoint:
            checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self._optimizer, step=self._step)
            manager = tf.train.CheckpointManager(
                checkpoint, self.contract.checkpoint.path, max_to_keep=CHECKPOINTS_KEPT
            )
            if self.rank == 0 and manager.latest_checkpoint:
                checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
                self._say(f"restored {manager.latest_checkpoint} at step {int(self._step.numpy())}")
        variables = [*self.model.variables, *self._optimizer.variables, self._step]
        ctf.broadcast_variables(variables, root_rank=0)
        return manager

    def report_loss(self, loss: Any) -> None:
        """The loss of the step just run (waits for the step to finish)."""
        self._loss = float(loss)

    def steps(self) -> Iterator[int]:
        """Yield the step numbers still to run, 1-based, timing and recording each."""
        first = self.completed_steps + 1
        if first > self.total_steps:
            self._say(f"nothing to do: already at step {self.completed_steps} of {self.total_steps}")
        for step in range(first, self.total_steps + 1):
            self._loss = None
            started = time.perf_counter()
            yield step
            if self._loss is None:
                raise RuntimeError("call report_loss(loss) in every step of TrainingRun.steps()")
            self._finish_step(step, time.perf_counter() - started)
        self._finish_run()

    def _finish_step(self, step: int, seconds: float) -> None:
        stats = self._communicator.take_stats()
        self.metrics.record_step(
            StepRecord(
                step=step,
                step_seconds=seconds,
                communication_seconds=stats.communication_seconds,
                exposed_seconds=stats.exposed_seconds,
                transfer_wait_seconds=stats.waiting_seconds,
                communicated_bytes=stats.nbytes,
                transfers=stats.transfers,
                loss=self._loss,
            )
        )
        if self._communicator.engine is not None:
            self.metrics.record_plan(self._communicator.engine.plan_record())
        self._step.assign(step)
        self._step_seconds.append(seconds)
        self._losses.append(self._loss)
        if self.contract.checkpoint and step % self.contract.checkpoint.interval_steps == 0:
            self._save_checkpoint(step)
        now = time.monotonic()
        if self.rank == 0 and (len(self._step_seconds) == 1 or now - self._last_progress >= PROGRESS_INTERVAL_SECONDS):
            self._last_progress = now
            print(format_report(self._report(step, seconds, final=False)), flush=True)

    def _report(self, step: int, seconds: float, final: bool) -> ProgressReport:
        return ProgressReport(
            step=step,
            total=self.total_steps,
            loss=self._losses[-1],
            step_seconds=seconds,
            examples_per_second=self.global_batch / seconds if seconds > 0 else 0.0,
            final=final,
        )

    def _finish_run(self) -> None:
        step = self.completed_steps
        if step != self._last_saved_step:
            self._save_checkpoint(step)
        self._check_weights_agree()
        if self.rank == 0 and self._step_seconds:
            # The first step traces and compiles the tf.function: leave it out of the averages.
            steady = self._step_seconds[1:] or self._step_seconds
            print(format_report(self._report(step, statistics.median(steady), final=True)), flush=True)

    def _save_checkpoint(self, step: int) -> None:
        if self._checkpoint_manager and self.rank == 0:
            self._checkpoint_manager.save(checkpoint_number=step)
        self._last_saved_step = step

    def weights_digest(self) -> str:
        """SHA-256 of the trainable weights, equal on every rank of a correct synchronous run."""
        digest = hashlib.sha256()
        for variable in self.model.trainable_variables:
            digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
        return digest.hexdigest()

    def _check_weights_agree(self) -> None:
        digest = self.weights_digest()
        self._say(f"weights digest {digest}")
        prefix = np.frombuffer(bytes.fromhex(digest[:16]), dtype=np.int64)
        every_rank = hvd.allgather(tf.constant(prefix), name="caramel_weights_digest").numpy()
        if len(set(every_rank.tolist())) != 1:
            raise RuntimeError(f"ranks finished with different weights: digest prefixes {every_rank.tolist()}")

    def _say(self, message: str) -> None:
        print(f"caramel: {message}", file=sys.stderr, flush=True)
