"""The transfer engine: runs each iteration's schedule in a communication thread.

The training loop hands over each gradient the moment backpropagation produces it
(`gradient_ready`) and, in the next forward pass, waits for a parameter only where it reads it
(`wait_updated`), instead of at a barrier before the step: a transfer's window stretches from
its gradient's birth to its parameter's first use. The communication thread walks the
iteration's schedule in order, waits for each transfer's gradients, averages them across ranks
with one Horovod collective, and applies the update of every parameter whose gradient is
complete.

Every rank walks the same schedule: the link model is fitted on each rank but rank 0's fit is
broadcast at the re-plan points, and the schedule is a pure function of it and the model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from caramel.api import Scheduling
from caramel.linkmodel import LinkModel, LinkObserver
from caramel.metrics import PlanRecord
from caramel.planning import Piece, Transfer
from caramel.schedule import Plan, TensorCost, best_schedule

# The link assumed before any transfer was timed: a gigabit link with a millisecond per collective.
INITIAL_LINK = LinkModel(alpha=1e-3, beta=1 / 125e6)


@dataclass
class IterationStats:
    """What the communication thread did for one iteration."""

    communication_seconds: float = 0.0
    waiting_seconds: float = 0.0
    nbytes: int = 0
    transfers: int = 0


class TransferEngine:
    """Averages the gradients of `tensors` across ranks and applies them, overlapping compute.

    `apply_update(piece, average)` receives every averaged piece of a flattened gradient as its
    transfer completes; a parameter counts as updated once all its pieces are applied.
    """

    def __init__(
        self,
        tensors: Sequence[TensorCost],
        scheduling: Scheduling,
        apply_update: Callable[[Piece, tf.Tensor], None],
        initial_link: LinkModel = INITIAL_LINK,
    ) -> None:
        self.tensors = list(tensors)
        self.scheduling = scheduling
        self.apply_update = apply_update
        self.observer = LinkObserver()
        self.link = initial_link
        self.plan: Plan = best_schedule(self.tensors, self.link, scheduling)
        self.plan_changes = 0
        self._gradients: list[tf.Tensor | None] = [None] * len(self.tensors)
        self._ready_iteration = [-1] * len(self.tensors)
        self._updated_iteration = [-1] * len(self.tensors)
        self._condition = threading.Condition()
        self._iterations_queued = 0
        self._stats: dict[int, IterationStats] = {}
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="caramel-transfers", daemon=True)
        self._thread.start()

    # -- the training loop's side ------------------------------------------------------------

    def gradient_ready(self, iteration: int, index: int, gradient: tf.Tensor) -> None:
        with self._condition:
            self._gradients[index] = gradient
            self._ready_iteration[index] = iteration
            if iteration >= self._iterations_queued:
                self._iterations_queued = iteration + 1
            self._condition.notify_all()

    def wait_updated(self, iteration: int, index: int) -> None:
        """Block until parameter `index` holds the update of `iteration` (no-op before the first)."""
        with self._condition:
            self._condition.wait_for(lambda: self._updated_iteration[index] >= iteration or self._error)
            self._raise_if_failed()

    def wait_all_updated(self, iteration: int) -> None:
        for index in range(len(self.tensors)):
            self.wait_updated(iteration, index)

    def stats(self, iteration: int) -> IterationStats:
        """The stats of a finished iteration (forgotten once read)."""
        with self._condition:
            return self._stats.pop(iteration, IterationStats())

    def plan_record(self) -> PlanRecord:
        return PlanRecord(self.plan.batch.max_bytes, self.link.alpha, self.link.beta, self.plan_changes)

    def close(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join(timeout=30)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("the transfer thread failed") from self._error

    # -- the communication thread ------------------------------------------------------------

    def _run(self) -> None:
        iteration = 0
        try:
            while True:
                with self._condition:
                    self._condition.wait_for(lambda: self._iterations_queued > iteration or self._stopping)
                    if self._iterations_queued <= iteration:
                        return
                if iteration > 0 and iteration % self.scheduling.replan_interval_steps == 0:
                    self._replan()
                self._run_iteration(iteration, self.plan.transfers)
                iteration += 1
        except BaseException as error:  # surfaced to the training loop by wait_updated
            with self._condition:
                self._error = error
                self._condition.notify_all()

    def _run_iteration(self, iteration: int, transfers: Sequence[Transfer]) -> None:
        stats = IterationStats()
        with self._condition:
            # Published first: it is complete by the time the last parameter is marked updated.
            self._stats[iteration] = stats
        pieces_left = [0] * len(self.tensors)
        for transfer in transfers:
            for piece in transfer.pieces:
                pieces_left[piece.tensor] += 1
        for transfer in transfers:
            waited = time.perf_counter()
            inputs = self._take_inputs(iteration, transfer)
            started = time.perf_counter()
            outputs = hvd.grouped_allreduce(inputs, op=hvd.Average)
            finished = time.perf_counter()
            self.observer.observe(transfer.nbytes, finished - started)
            stats.waiting_seconds += started - waited
            stats.communication_seconds += finished - started
            stats.nbytes += transfer.nbytes
            stats.transfers += 1
            for piece, output in zip(transfer.pieces, outputs):
                self.apply_update(piece, output)
                pieces_left[piece.tensor] -= 1
                if pieces_left[piece.tensor] == 0:
                    self._mark_updated(iteration, piece.tensor)

    def _take_inputs(self, iteration: int, transfer: Transfer) -> list[tf.Tensor]:
        with self._condition:
            needed = {piece.tensor for piece in transfer.pieces}
            self._condition.wait_for(lambda: all(self._ready_iteration[i] >= iteration for i in needed) or self._stopping)
            if self._stopping:
                raise RuntimeError("stopped while waiting for gradients")
            gradients = {i: self._gradients[i] for i in needed}
        # Slices of a flat tensor along its only axis share its buffer: chunking copies nothing.
        return [tf.reshape(gradients[p.tensor], [-1])[p.start : p.stop] for p in transfer.pieces]

    def _mark_updated(self, iteration: int, index: int) -> None:
        with self._condition:
            self._gradients[index] = None
            self._updated_iteration[index] = iteration
            self._condition.notify_all()

    def _replan(self) -> None:
        """Refit the link on rank 0, share it, and re-plan identically on every rank."""
        local = self.observer.model() or self.link
        shared = hvd.broadcast(tf.constant([local.alpha, local.beta], dtype=tf.float64), root_rank=0, name="caramel_link")
        alpha, beta = (float(value) for value in np.asarray(shared))
        self.link = LinkModel(alpha=alpha, beta=beta)
        plan = best_schedule(self.tensors, self.link, self.scheduling)
        if plan.transfers != self.plan.transfers:
            self.plan_changes += 1
        self.plan = plan
