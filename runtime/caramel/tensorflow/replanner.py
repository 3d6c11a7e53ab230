"""Re-planning: which transfer plan is in force, and when every rank switches to a new one.

The first plan is made from what every rank knows before any step: the gradients' sizes. It
sends them in Horovod's order, in buckets (`initial_plan`). At execution boundaries (between
graph executions, never inside a step) the replanner probes the link, fits alpha and beta from
the probes and the timed transfers, and takes the measured release times (TicTac's TAC). Rank
0's measurements are broadcast, so every rank searches the same inputs and finds the same plan.
The first measured plan is searched at the first boundary after a measured step, and adopted
there. Later searches run in a background thread while training goes on, and every rank adopts
the result at the first boundary `PLAN_LAG_STEPS` steps later, if it is predicted to be clearly
faster than the plan in force: adopting a plan re-traces the step, which costs seconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from caramel.job.api import Scheduling
from caramel.planner.linkmodel import LinkModel, LinkObserver
from caramel.planner.schedule import Plan, TensorCost, best_schedule, initial_plan, simulate
from caramel.planner.timing import StepTimes, typical_backward_seconds

# After the first measured plan: one early re-plan once the link was timed on more real
# transfers, then one every replanIntervalSteps.
EARLY_REPLAN_STEP = 10
# A plan searched for at one boundary is adopted at the first boundary this many steps later,
# on every rank, so that the search never stalls a step.
PLAN_LAG_STEPS = 1
# Steps whose timings the replanner remembers for release times.
RECENT_STEPS = 16
# A new plan must be predicted this much faster than the measured one in force (re-tracing costs
# seconds, and a smaller gain may be noise).
MIN_GAIN = 0.10
# Forward passes are not timed: each layer's is taken as half its backward pass.
FORWARD_SHARE_OF_BACKWARD = 0.5
# Probe collectives at every re-plan: (elements, repeats). A one-element allreduce costs alpha;
# a 4 MiB one adds bandwidth.
PROBES = ((1, 3), (1024 * 1024, 2))


def measured_costs(tensors: Sequence[TensorCost], backward_seconds: Sequence[float]) -> list[TensorCost]:
    return [
        dataclasses.replace(t, backward_seconds=float(b), forward_seconds=FORWARD_SHARE_OF_BACKWARD * float(b))
        for t, b in zip(tensors, backward_seconds)
    ]


@dataclass(frozen=True)
class _Search:
    adopt_at: int
    link: LinkModel
    tensors: list[TensorCost]
    result: Future[Plan]


class Replanner:
    """The plan in force for one model's gradients, and its re-planning."""

    def __init__(self, scheduling: Scheduling, link: LinkModel) -> None:
        self.scheduling = scheduling
        self.link = link
        self.plan: Plan | None = None
        self.version = 0
        """Increases with every plan adopted; a graph traced for an older version is stale."""
        self.plan_changes = 0
        self.measured = False
        """Whether the plan in force was made from measurements."""
        self._tensors: list[TensorCost] = []
        self._observer = LinkObserver()
        self._recent: deque[StepTimes] = deque(maxlen=RECENT_STEPS)
        self._next_replan = EARLY_REPLAN_STEP
        self._search: _Search | None = None
        self._searcher = ThreadPoolExecutor(1, thread_name_prefix="caramel-planner")

    @property
    def gradients(self) -> int:
        """How many gradients the plans are for."""
        return len(self._tensors)

    def plan_for(self, sizes: Sequence[tuple[int, int]]) -> Plan:
        """The plan in force for gradients of these (bytes, item size); the first one is made now."""
        if self.plan is None:
            self._tensors = [TensorCost(nbytes, item) for nbytes, item in sizes]
            self.plan = initial_plan(self._tensors, self.scheduling)
            self.version += 1
        elif [(t.nbytes, t.item_size) for t in self._tensors] != list(sizes):
            raise ValueError(
                "the gradients changed between steps (number, sizes or dtypes); Caramel plans the "
                "communication of one fixed set of trainable variables"
            )
        return self.plan

    def observe(self, steps: Sequence[StepTimes]) -> None:
        """Timings of steps just run with the plan in force."""
        for step in steps:
            self._recent.append(step)
            for transfer in step.transfers:
                self._observer.observe_transfer(transfer.nbytes, transfer.seconds)

    def at_boundary(self, completed_steps: int) -> bool:
        """Between executions, on every rank at the same step count: adopt a plan that is due,
        start a search that is due. True if a new plan is now in force (stale graphs must be
        re-traced)."""
        if not self.measured:
            if typical_backward_seconds(self._recent) is None:
                return False
            self._start_search(completed_steps)
            self.measured = True
            return self._adopt(self._search, required_gain=0.0)
        adopted = False
        if self._search is not None and completed_steps >= self._search.adopt_at:
            adopted = self._adopt(self._search)
        if self.plan is not None and self._search is None and completed_steps >= self._next_replan:
            self._start_search(completed_steps)
            self._next_replan = completed_steps + self.scheduling.replan_interval_steps
        return adopted

    def close(self) -> None:
        self._searcher.shutdown(wait=False, cancel_futures=True)

    def _start_search(self, completed_steps: int) -> None:
        self._probe()
        local = self._observer.model(previous=self.link)
        measured = typical_backward_seconds(self._recent) or []
        # Every rank runs the same model, so every rank broadcasts a vector of the same length.
        shared = _broadcast([local.alpha, local.beta, *measured])
        link = LinkModel(alpha=float(shared[0]), beta=float(shared[1]))
        tensors = measured_costs(self._tensors, shared[2:]) if measured else self._tensors
        search = self._searcher.submit(best_schedule, tensors, link, self.scheduling)
        self._search = _Search(completed_steps + PLAN_LAG_STEPS, link, tensors, search)

    def _adopt(self, search: _Search, required_gain: float = MIN_GAIN) -> bool:
        self._search = None
        plan = search.result.result()
        self.link = search.link
        current = simulate(search.tensors, self.plan.transfers, search.link)
        self._tensors = search.tensors
        if plan.transfers == self.plan.transfers or plan.predicted_step_seconds > current * (1 - required_gain):
            return False
        self.plan = plan
        self.version += 1
        self.plan_changes += 1
        return True

    def _probe(self) -> None:
        """Time a few back-to-back collectives; the first of each size also lines the ranks up."""
        self._observer.new_probe_round()
        for elements, repeats in PROBES:
            probe = tf.ones([elements], dtype=tf.float32)
            for _ in range(repeats + 1):
                started = time.perf_counter()
                hvd.allreduce(probe, op=hvd.Average, name="caramel_probe").numpy()
                self._observer.observe_probe(elements * 4, time.perf_counter() - started)


def _broadcast(values: list[float]) -> np.ndarray:
    return hvd.broadcast(tf.constant(values, dtype=tf.float64), root_rank=0, name="caramel_measurements").numpy()
