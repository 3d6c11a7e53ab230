"""What a training run keeps besides the model: its step count, metrics, progress lines and checkpoints.

Shared by custom loops (`TrainingRun`) and Keras (`TrainingCallback`). On start, rank 0
restores the latest checkpoint and every rank takes rank 0's variables, so all ranks begin
identical; after each step the metrics are recorded and rank 0 logs progress now and then;
at the end every rank prints a digest of its trainable weights and the run fails if any two
ranks disagree.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from collections.abc import Collection, Sequence

import numpy as np
import tensorflow as tf

from caramel.contract.progress import ProgressReport, format_report
from caramel.metrics import PlanRecord
from caramel.planner.timing import StepTimes
from caramel.tensorflow.keras_version import optimizer_state
from caramel.tensorflow.runtime import Runtime

# Rank 0 logs progress at most this often (and always on the first and last step).
PROGRESS_INTERVAL_SECONDS = 0.5
CHECKPOINTS_KEPT = 3
# Elements of a weight hashed at a time by `weights_digest` (16 MiB of float32).
DIGEST_SLICE_ELEMENTS = 4 * 1024 * 1024


class Ledger:
    """One process's record of a run. `counter` is the variable that counts the steps done (it is
    checkpointed with the model and the optimizer)."""

    def __init__(
        self,
        runtime: Runtime,
        model: tf.keras.Model,
        optimizer: tf.keras.optimizers.Optimizer,
        counter: tf.Variable,
        *,
        total_steps: int,
        batch_size: int | None,
        checkpoints: bool = True,
        local_variables: Collection[int] = (),
    ) -> None:
        self.runtime = runtime
        self.model = model
        self.optimizer = optimizer
        self.counter = counter
        self.total_steps = total_steps
        self.global_batch = None if batch_size is None else batch_size * runtime.size
        """Examples per step over all ranks, for examples/s (None: not known yet)."""
        self.rank = runtime.rank
        self.contract = runtime.contract
        self.metrics = runtime.metrics
        self.local_variables = local_variables
        """The ids of variables each rank keeps its own: not broadcast (Horovod's callback's local_variables)."""
        self.epochs = tf.Variable(0, dtype=tf.int64, trainable=False, name="caramel_epochs")
        """Epochs done (Keras resumes at an epoch boundary), kept in checkpoints."""
        self._checkpoint = self.contract.checkpoint if checkpoints else None
        self._manager = self._restore_and_sync()
        self._last_saved_step = self.completed_steps
        self.metrics.checkpoint_step.set(self._last_saved_step)  # the restored checkpoint's step; 0 without one
        self._step_seconds: list[float] = []
        self._last_loss = float("nan")
        self._last_progress = 0.0

    @property
    def completed_steps(self) -> int:
        """Steps done so far, restored ones included."""
        return int(self.counter.numpy())

    def _restore_and_sync(self) -> tf.train.CheckpointManager | None:
        # Optimizer state must exist before it can be restored or broadcast.
        optimizer_variables = optimizer_state(self.optimizer, self.model.trainable_variables)
        manager = None
        if self._checkpoint is not None:
            checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.counter, epochs=self.epochs)
            manager = tf.train.CheckpointManager(checkpoint, self._checkpoint.path, max_to_keep=CHECKPOINTS_KEPT)
            if self.rank == 0 and manager.latest_checkpoint:
                checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
                say(f"restored {manager.latest_checkpoint} at step {self.completed_steps}")
        # The counter may be one of the optimizer's own variables (Keras counts its iterations).
        # The optimizer's variables include its learning rate: restored on rank 0 alone, it would
        # leave the ranks updating at different rates, and their weights apart.
        variables = {id(v): v for v in [*self.model.variables, *optimizer_variables, self.counter, self.epochs] if id(v) not in self.local_variables}
        broadcast_variables(self.runtime, list(variables.values()))
        return manager

    def record_steps(self, first_step: int, seconds: float, losses: Sequence[float], times: Sequence[StepTimes | None]) -> None:
        """The steps of an execution ended, from `first_step` on, each in `seconds`: their metrics;
        once per execution, what the runtime decided and the plan it runs (variables read between
        executions, not per step); now and then a progress line from rank 0."""
        for offset, (loss, step_times) in enumerate(zip(losses, times)):
            self.metrics.record_step(first_step + offset, seconds, loss, step_times)
            self._step_seconds.append(seconds)
        last = first_step + len(losses) - 1
        self.metrics.record_plan(plan_record(self.runtime))
        decision = self.runtime.communicator.control.selector.new_decision()
        if decision and self.rank == 0:
            say(f"at step {last}, {decision}")
        self._last_loss = losses[-1]
        now = time.monotonic()
        if self.rank == 0 and (len(self._step_seconds) == len(losses) or now - self._last_progress >= PROGRESS_INTERVAL_SECONDS):
            self._last_progress = now
            print(format_report(self._report(last, seconds, final=False)), flush=True)

    def checkpoint_if_due(self) -> None:
        """At a point where the variables hold the state after the last step counted: save if
        spec.checkpoint.intervalSteps steps passed since the last checkpoint."""
        if self._checkpoint is not None and self.completed_steps - self._last_saved_step >= self._checkpoint.interval_steps:
            self._save()

    def finish(self) -> None:
        """The run's end: the last checkpoint, the weights check, the final progress line."""
        if self.completed_steps != self._last_saved_step:
            self._save()
        digest = weights_digest(self.model.trainable_variables, leaving_out=self.runtime.local_variables)
        say(f"weights digest {digest}")
        prefix = np.frombuffer(bytes.fromhex(digest[:16]), dtype=np.int64)
        every_rank = self.runtime.backend.all_gather(tf.constant(prefix), name="caramel_weights_digest").numpy().reshape(-1)
        if len(set(every_rank.tolist())) != 1:
            raise RuntimeError(f"ranks finished with different weights: digest prefixes {every_rank.tolist()}")
        if self.rank == 0:
            # The first execution traces and compiles the graph: leave it out of the averages. A
            # run restored at its last step runs none, and still reports the step it ended at
            # (the job's final step comes from this line), with no step time and no loss.
            steady = self._step_seconds[1:] or self._step_seconds or [0.0]
            print(format_report(self._report(self.completed_steps, statistics.median(steady), final=True)), flush=True)

    def _save(self) -> None:
        if self._manager and self.rank == 0:
            self._manager.save(checkpoint_number=self.completed_steps)
        self._last_saved_step = self.completed_steps
        if self._manager:
            self.metrics.checkpoint_step.set(self._last_saved_step)

    def _report(self, step: int, seconds: float, final: bool) -> ProgressReport:
        return ProgressReport(
            step=step,
            total=self.total_steps,
            loss=self._last_loss,
            step_seconds=seconds,
            examples_per_second=self.global_batch / seconds if seconds > 0 and self.global_batch else 0.0,
            final=final,
        )


def broadcast_variables(runtime: Runtime, variables: list[tf.Variable], root_rank: int = 0) -> None:
    """Overwrite the variables on every rank with rank `root_rank`'s values."""
    if not variables:
        return
    for variable, value in zip(variables, runtime.backend.broadcast([tf.convert_to_tensor(v) for v in variables], root_rank, "caramel_variables")):
        variable.assign(value)


def plan_record(runtime: Runtime) -> PlanRecord:
    """The plan in force, the link as last measured (what a restarted gang plans its first steps
    from: docs/metrics.md), and whether the steps run it."""
    gradient_communicator = runtime.communicator
    replanner = gradient_communicator.control.replanner
    bucket = replanner.plan.batch.max_bytes if replanner.plan else 0
    return PlanRecord(bucket, replanner.link.alpha, replanner.link.beta, replanner.plan_changes, gradient_communicator.runs_plan)


def weights_digest(variables: Sequence[tf.Variable], leaving_out: Collection[int] = ()) -> str:
    """SHA-256 of the variables (their bytes in order; those whose id is in `leaving_out`, each
    rank's own, left out), equal on every rank of a correct synchronous run. Hashed a slice at a
    time: `numpy()` and `tobytes()` of a whole variable were two transient copies of it, which for
    a model with one large weight set the run's peak RSS on every rank, at the end of training."""
    digest = hashlib.sha256()
    for variable in (variable for variable in variables if id(variable) not in leaving_out):
        flat = tf.reshape(variable, [-1])  # the variable's buffer, read without a copy
        for start in range(0, flat.shape[0], DIGEST_SLICE_ELEMENTS):
            digest.update(flat[start : start + DIGEST_SLICE_ELEMENTS].numpy())
    return digest.hexdigest()


def say(message: str) -> None:
    print(f"caramel: {message}", file=sys.stderr, flush=True)
