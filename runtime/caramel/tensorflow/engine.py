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

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from caramel.job.api import Scheduling
from caramel.planner.linkmodel import LinkModel, LinkObserver
from caramel.metrics import PlanRecord
from caramel.planner.transfers import Piece, Transfer
from caramel.planner.schedule import Plan, TensorCost, backward_seconds_from_releases, best_schedule

# The link assumed before any transfer was timed: a gigabit link with a millisecond per collective.
INITIAL_LINK = LinkModel(alpha=1e-3, beta=1 / 125e6)
# Collectives in flight at once. With two, the next transfer is already queued in Horovod when
# the current one ends, so the hand-over between threads (milliseconds on a loaded machine) is
# off the link's path; Horovod keeps the queue's order, which is the schedule's.
TRANSFERS_IN_FLIGHT = 2
# The first plan rests on probes alone, which show a collective's best case: re-plan early, as
# soon as real transfers have been timed, then every replanIntervalSteps.
EARLY_REPLANS = (0, 3, 10)
# A plan searched for at a re-plan point takes effect this many iterations later, the same on
# every rank: the search (a fraction of a second) runs in a background thread meanwhile instead
# of stalling the transfers. The first plan is waited for.
PLAN_LAG_ITERATIONS = 2
# Probe collectives at every re-plan: (elements, repeats). A one-element allreduce costs alpha;
# a 4 MiB one adds bandwidth. Back to back right after the ranks met, they time the link alone.
PROBES = ((1, 3), (1024 * 1024, 2))


class _Reducers:
    """Graph-mode allreduce functions, one per position in the schedule.

    In a graph, Horovod names each request after its node. A position keeps its name and its
    shape from one iteration to the next, so Horovod's response cache recognises the request
    and skips most of the negotiation that would otherwise cost every collective milliseconds;
    eager requests would all share one name. Pieces of one dtype travel as one flat buffer,
    whose slices afterwards share its memory.
    """

    def __init__(self) -> None:
        self._functions: dict[tuple[int, tf.DType, int], Callable[[tf.Tensor], tf.Tensor]] = {}

    def forget(self) -> None:
        """A new schedule: the old positions' functions will not be called again."""
        self._functions.clear()

    def _function(self, position: int, dtype: tf.DType, length: int) -> Callable[[tf.Tensor], tf.Tensor]:
        key = (position, dtype, length)
        if key not in self._functions:
            name = f"caramel_transfer{position}_{dtype.name}"
            self._functions[key] = tf.function(
                lambda flat: hvd.allreduce(flat, op=hvd.Average, name=name),
                input_signature=[tf.TensorSpec([length], dtype)],
            )
        return self._functions[key]

    def reduce(self, position: int, inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        outputs: list[tf.Tensor | None] = [None] * len(inputs)
        for dtype in dict.fromkeys(tensor.dtype for tensor in inputs):
            members = [i for i, tensor in enumerate(inputs) if tensor.dtype == dtype]
            flat = inputs[members[0]] if len(members) == 1 else tf.concat([inputs[i] for i in members], axis=0)
            reduced = self._function(position, dtype, int(flat.shape[0]))(flat)
            offset = 0
            for i in members:
                length = int(inputs[i].shape[0])
                outputs[i] = reduced[offset : offset + length]
                offset += length
        return outputs


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
    transfer completes (in the engine's collective thread, not the caller's); a parameter counts
    as updated once all its pieces are applied.
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
        # Made at iteration 0, once the link has been probed (see EARLY_REPLANS).
        self.plan: Plan | None = None
        self.plan_changes = 0
        self._gradients: list[tf.Tensor | None] = [None] * len(self.tensors)
        self._ready_iteration = [-1] * len(self.tensors)
        self._updated_iteration = [-1] * len(self.tensors)
        self._condition = threading.Condition()
        self._iterations_queued = 0
        self._stats: dict[int, IterationStats] = {}
        self._error: BaseException | None = None
        self._stopping = False
        self._reducers = _Reducers()
        self._pool = ThreadPoolExecutor(TRANSFERS_IN_FLIGHT, thread_name_prefix="caramel-collective")
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="caramel-planner")
        # Plans being searched for: (the iteration they take effect at, the link they assume, the search).
        self._pending_plans: deque[tuple[int, LinkModel, Future[Plan]]] = deque()
        self._last_finished = 0.0
        # Without layer times from the model (the tape and optimizer drop-ins), plan with the
        # times at which backpropagation hands the gradients over, measured (TicTac's TAC).
        self._measuring_releases = not any(t.forward_seconds or t.backward_seconds for t in self.tensors)
        self._handed_over: dict[int, list[float]] = {}  # iteration -> when each gradient came
        self._measured_backward = [0.0] * len(self.tensors)
        self._thread = threading.Thread(target=self._run, name="caramel-transfers", daemon=True)
        self._thread.start()

    # -- the training loop's side ------------------------------------------------------------

    def gradient_ready(self, iteration: int, index: int, gradient: tf.Tensor) -> None:
        with self._condition:
            if self._measuring_releases:
                self._handed_over.setdefault(iteration, [math.nan] * len(self.tensors))[index] = time.perf_counter()
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
        self._pool.shutdown(wait=False)
        self._planner.shutdown(wait=False, cancel_futures=True)

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
                if iteration in EARLY_REPLANS or iteration % self.scheduling.replan_interval_steps == 0:
                    self._replan(iteration)
                while self._pending_plans and self._pending_plans[0][0] == iteration:
                    _, link, search = self._pending_plans.popleft()
                    self._adopt(search.result(), link)
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
        in_flight: deque[Future[None]] = deque()
        for position, transfer in enumerate(transfers):
            waited = time.perf_counter()
            inputs = self._take_inputs(iteration, transfer)
            ready = time.perf_counter()
            stats.waiting_seconds += ready - waited
            if len(in_flight) == TRANSFERS_IN_FLIGHT:
                in_flight.popleft().result()  # frees the slot this transfer takes
            in_flight.append(self._pool.submit(self._transfer, iteration, transfer, inputs, position, ready, stats, pieces_left))
        while in_flight:
            in_flight.popleft().result()
        if self._measuring_releases:
            with self._condition:
                handed_over = self._handed_over.pop(iteration)
            self._measured_backward = backward_seconds_from_releases(handed_over)

    def _transfer(self, iteration, transfer, inputs, position, ready, stats, pieces_left) -> None:
        """One collective in a pool thread, then the updates it completes."""
        outputs = self._reducers.reduce(position, inputs)
        finished = time.perf_counter()
        with self._condition:
            # What this transfer cost the link: from when it could have started (its gradients
            # there, the transfer before it done) to its end, hand-overs between threads included,
            # since a plan pays them for every transfer.
            busy = max(0.0, finished - max(ready, self._last_finished))
            self._last_finished = max(self._last_finished, finished)
            self.observer.observe_transfer(transfer.nbytes, busy)
            stats.communication_seconds += busy
            stats.nbytes += transfer.nbytes
            stats.transfers += 1
        for piece, output in zip(transfer.pieces, outputs):
            self.apply_update(piece, output)
            with self._condition:
                pieces_left[piece.tensor] -= 1
                if pieces_left[piece.tensor] == 0:
                    self._gradients[piece.tensor] = None
                    self._updated_iteration[piece.tensor] = iteration
                    self._condition.notify_all()

    def _take_inputs(self, iteration: int, transfer: Transfer) -> list[tf.Tensor]:
        with self._condition:
            needed = {piece.tensor for piece in transfer.pieces}
            self._condition.wait_for(lambda: all(self._ready_iteration[i] >= iteration for i in needed) or self._stopping)
            if self._stopping:
                raise RuntimeError("stopped while waiting for gradients")
            gradients = {i: self._gradients[i] for i in needed}
        # Slices of a flat tensor along its only axis share its buffer: chunking copies nothing.
        return [tf.reshape(gradients[p.tensor], [-1])[p.start : p.stop] for p in transfer.pieces]

    def _replan(self, iteration: int) -> None:
        """Probe and refit the link, share rank 0's model (and its measured release times), and
        start the search for a plan from it, which every rank makes identically and adopts at
        the same iteration."""
        self._probe()
        local = self.observer.model(previous=self.link)
        # Every rank runs the same model, so every rank broadcasts a vector of the same length.
        measured = [local.alpha, local.beta, *(self._measured_backward if self._measuring_releases else [])]
        shared = np.asarray(hvd.broadcast(tf.constant(measured, dtype=tf.float64), root_rank=0, name="caramel_link"))
        link = LinkModel(alpha=float(shared[0]), beta=float(shared[1]))
        tensors = self.tensors
        if self._measuring_releases:
            tensors = [dataclasses.replace(t, backward_seconds=float(b)) for t, b in zip(self.tensors, shared[2:])]
        search = self._planner.submit(best_schedule, tensors, link, self.scheduling)
        if self.plan is None:
            self._adopt(search.result(), link)
        else:
            self._pending_plans.append((iteration + PLAN_LAG_ITERATIONS, link, search))

    def _adopt(self, plan: Plan, link: LinkModel) -> None:
        if self.plan is not None and plan.transfers != self.plan.transfers:
            self.plan_changes += 1
            self._reducers.forget()
        self.plan = plan
        self.link = link

    def _probe(self) -> None:
        """Time a few back-to-back collectives; the first of each size also lines the ranks up."""
        self.observer.new_probe_round()
        for elements, repeats in PROBES:
            probe = tf.ones([elements], dtype=tf.float32)
            for _ in range(repeats + 1):
                started = time.perf_counter()
                hvd.allreduce(probe, op=hvd.Average, name="caramel_probe")
                self.observer.observe_probe(elements * 4, time.perf_counter() - started)
