"""Re-planning: which transfer plan is in force, and when every rank switches to a new one.

The first plan is made from what every rank knows before any step: the gradients' sizes. It sends
them in Horovod's order, in buckets (`initial_plan`). At execution boundaries (between graph
executions, never inside a step) every rank probes the link together, with the all-reduce that moves
the step's transfers (Horovod's ring or MULTITREE's trees, whose costs differ); rank 0 fits alpha
and beta from the probes and the timed transfers (each at its least over ranks), takes the measured
release times (TicTac's TAC), and searches for a plan in a process of its own
(`caramel.planner.search`) while training goes on. At the first boundary at least `PLAN_LAG_STEPS`
steps later where the search has ended (it runs at the lowest priority, and the steps do not wait
for it), rank 0 broadcasts its decision, the plan and its link model, so every rank runs the same
plan from the same step. Adopting a plan re-traces the step, which costs seconds to minutes (a
several-step graph of a large model), so a plan is adopted only if it is predicted to be clearly
faster than the plan in force, and only if that gain repays the re-trace, as last measured, within
the steps left (or `PAYBACK_STEPS` where nobody said how many are left). The first measured plan is
searched, beside the steps, from the first boundary after a step stamped its gradients' releases,
and decided at the first boundary after the search ended: until then the steps run the backend's
own way, one per graph, and several per graph (the cross-iteration window) cost a larger graph to
build, so where the steps left are known the steps go on to several per graph, with the plan
found, only if its gain over the backend's own way (both predicted by one model, the gain never
more than the step measured so far leaves) repays that build (as the caller estimated it) within
them.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tensorflow as tf

from caramel.contract.api import Scheduling
from caramel.planner.linkmodel import LinkModel, LinkObserver
from caramel.planner.policy import PlanningPolicy
from caramel.planner.schedule import (
    PAYBACK_STEPS,
    PLAN_LAG_STEPS,
    Plan,
    TensorCost,
    initial_plan,
    own_way_transfers,
    replan_interval,
    repays_retrace,
    simulate,
)
from caramel.collectives.backend import Backend, ReduceOp
from caramel.planner.search import Search, plan_document, plan_from
from caramel.planner.timing import FORWARD_SHARE_OF_BACKWARD, StepTimes, typical_backward_seconds

# Steps whose timings the replanner remembers for release times.
RECENT_STEPS = 16
# A new plan must be predicted this much faster than the measured one in force (re-tracing costs
# seconds, and a smaller gain may be noise).
MIN_GAIN = 0.10
# Probe collectives at every re-plan: (elements, repeats). A one-element allreduce costs alpha;
# a 4 MiB one adds bandwidth.
PROBES = ((1, 3), (1024 * 1024, 2))

ProbeAllreduce = Callable[[tf.Tensor], object]
"""Averages a float32 tensor over all ranks eagerly, and returns once it is done."""


def measured_costs(tensors: Sequence[TensorCost], backward_seconds: Sequence[float]) -> list[TensorCost]:
    return [
        dataclasses.replace(t, backward_seconds=float(b), forward_seconds=FORWARD_SHARE_OF_BACKWARD * float(b))
        for t, b in zip(tensors, backward_seconds)
    ]


@dataclass(frozen=True)
class _PendingSearch:
    adopt_at: int
    link: LinkModel
    tensors: list[TensorCost]
    search: Search | None
    """The search itself, on rank 0; the other ranks receive its outcome."""


class Replanner:
    """The plan in force for one model's gradients, and its re-planning."""

    def __init__(self, scheduling: Scheduling, link: LinkModel, backend: Backend, policy: PlanningPolicy = PlanningPolicy()) -> None:
        self.scheduling = scheduling
        self.policy = policy
        """How the searches order and batch, and whether the steps wait for the first one."""
        self.backend = backend
        self.link = link
        """The link as last measured, at the last re-plan."""
        self.plan: Plan | None = None
        self.plan_link = link
        """The link the plan in force was made for (a later re-plan that keeps the plan measures the
        link again, and its prediction was not made for that one)."""
        self.version = 0
        """Increases with every plan adopted; a graph traced for an older version is stale."""
        self.plan_changes = 0
        self.measured = False
        """Whether the plan in force was made from measurements."""
        self.several_steps = False
        """Whether the steps run several per graph: decided with the first measured plan."""
        self._tensors: list[TensorCost] = []
        self._observer = LinkObserver()
        self._recent: deque[StepTimes] = deque(maxlen=RECENT_STEPS)
        self._next_replan = 0
        self._pending: _PendingSearch | None = None
        self.probe_allreduce: ProbeAllreduce = backend.probe
        """What the probes time: the all-reduce the plan's transfers go through."""
        self.seconds_per_step: float | None = None
        """Of the last execution that traced nothing and ran with no search beside it (None
        until one ran): what plans and re-plans are weighed against (`executed`)."""
        self.steps_per_execution: int | None = None
        """Steps per graph execution, as the last boundary was told: plans are predicted for such
        executions (None: the steady state of steps that never meet an execution boundary)."""
        self._interval_steps = scheduling.replan_interval_steps
        """Steps between re-plans, as rank 0 last decided (`replan_interval`)."""
        self._search_start_seconds = 0.0
        """What starting the last search cost this process (probes, link fit, the search's process)."""
        self._beside_seconds = 0.0
        """How much longer than `seconds_per_step` the steps took while the pending search ran
        beside them: on cores the ranks share, its CPU is theirs, and it is part of what a
        re-plan costs."""
        self.communicated = False
        """Whether the last boundary ran collectives: the step across it took longer for it."""
        self.retrace_seconds: float | None = None
        """What adopting the last plan cost: its first execution's time beyond an ordinary one's.
        Before the first measured plan, the caller's estimate of what building its graphs of
        several steps will cost (None: nothing to weigh). Set by `rebuild_cost`."""
        self.decided_at: list[int] = []
        """The completed steps at which a search's plan was decided (adopted or not), in order."""

    @property
    def gradients(self) -> int:
        """How many gradients the plans are for."""
        return len(self._tensors)

    def plan_for(self, sizes: Sequence[tuple[int, int]]) -> Plan:
        """The plan in force for gradients of these (bytes, item size); the first one is made now."""
        if self.plan is None:
            self._tensors = [TensorCost(nbytes, item) for nbytes, item in sizes]
            self.plan = initial_plan(self._tensors, self.scheduling)
            self.plan_link = self.link
            self.version += 1
        elif [(t.nbytes, t.item_size) for t in self._tensors] != list(sizes):
            raise ValueError(
                "the gradients changed between steps (number, sizes or dtypes); Caramel plans the "
                "communication of one fixed set of trainable variables"
            )
        return self.plan

    def rebuild_cost(self, seconds: float) -> None:
        """What building the graphs for a new plan costs: estimated before the first measured
        plan, measured after each plan adopted. A later plan is adopted only if it repays it."""
        self.retrace_seconds = seconds

    def require_several_steps(self) -> None:
        """The steps must run several per graph whatever a plan gains (the gradients go through
        MULTITREE's trees, which only Caramel's graph of several steps uses)."""
        self.several_steps = True

    @property
    def searching(self) -> bool:
        """Whether rank 0's search for the next plan is still running (on rank 0; False elsewhere)."""
        pending = self._pending
        return pending is not None and pending.search is not None and not pending.search.done()

    def executed(self, steps: int, seconds: float) -> None:
        """An execution of `steps` steps that traced nothing took `seconds`."""
        if self._pending is not None and self.seconds_per_step is not None:
            self._beside_seconds += max(0.0, seconds - steps * self.seconds_per_step)
        else:
            self.seconds_per_step = seconds / steps

    def observe(self, steps: Sequence[StepTimes]) -> None:
        """Timings of steps just run with the plan in force."""
        for step in steps:
            self._recent.append(step)
            for transfer in step.transfers:
                self._observer.observe_transfer(transfer.nbytes, transfer.seconds)

    def at_boundary(self, completed_steps: int, steps_per_execution: int | None, steps_left: int | None = None, may_search: bool = True) -> bool:
        """Between executions, on every rank at the same step count: adopt a plan that is due,
        start a search that is due. True if a new plan is now in force (stale graphs must be
        re-traced). The steps run `steps_per_execution` per graph execution (plans are predicted
        for such executions); `steps_left`, where known, is how many steps the training still
        runs. `communicated` then says whether this boundary ran collectives (probes, a decision)."""
        self.communicated = False
        self.steps_per_execution = steps_per_execution
        if not self.measured:
            return self._first_plan(completed_steps, steps_left)
        if not self.several_steps:
            return False  # one step per graph: no order of the transfers has a window to gain in
        adopted = False
        if self._pending is not None and completed_steps >= self._pending.adopt_at and self._search_done(self._pending):
            adopted = self._adopt(self._pending, completed_steps, steps_left)
            self._pending = None
        if may_search and self.plan is not None and self._pending is None and completed_steps >= self._next_replan:
            self._pending = self._start_search(completed_steps)
            self._next_replan = completed_steps + self._interval_steps
        return adopted

    def _first_plan(self, completed_steps: int, steps_left: int | None) -> bool:
        """The first measured plan: searched once the steps' releases were stamped, beside the
        steps (which go on, the backend's own way), and decided, with whether the steps go on to
        several per graph, at the first boundary after the search ended."""
        if self._pending is None:
            if typical_backward_seconds(self._recent) is None:
                return False
            self._pending = self._start_search(completed_steps)
            if not self.policy.first_plan_waits:
                return False
        elif completed_steps < self._pending.adopt_at or not self._search_done(self._pending):
            return False
        self.measured = True
        adopted = self._adopt(self._pending, completed_steps, steps_left, first=True)
        self._pending = None
        self._next_replan = completed_steps + self._interval_steps  # as this decision weighed a re-plan's cost
        return adopted

    def observe_releases(self, backward_seconds: Sequence[float]) -> None:
        """Per gradient, the backward compute that released it, from a step of the backend's own
        way, which times no transfer."""
        self._recent.append(StepTimes(transfers=(), backward_seconds=tuple(backward_seconds), communication_seconds=0.0,
                                      transfer_wait_seconds=0.0, exposed_seconds=0.0))  # fmt: skip

    @property
    def recent_steps(self) -> list[StepTimes]:
        """The timings of the last steps observed that ran the plan (of the last RECENT_STEPS)."""
        return [step for step in self._recent if step.transfers]

    @property
    def in_force(self) -> Plan:
        """The plan in force (the first is made by `plan_for`, as the first step is traced)."""
        if self.plan is None:
            raise RuntimeError("no plan yet: the first is made as the first step is traced (plan_for)")
        return self.plan

    def describe(self) -> str:
        """The plan in force and the link it was made for, for people."""
        plan = self.in_force
        largest = max(transfer.nbytes for transfer in plan.transfers) / 2**20
        return (
            f"plan {self.version}: {len(plan.transfers)} transfers per step (largest {largest:.3g} MiB), predicted step "
            f"{plan.predicted_step_seconds:.3g} s; link alpha {self.plan_link.alpha * 1e3:.3g} ms, "
            f"{self.plan_link.bytes_per_second / 1e6:.4g} MB/s"
        )

    def _start_search(self, completed_steps: int) -> _PendingSearch:
        self.communicated = True
        started = time.perf_counter()
        self._probe()
        # A transfer starts once the last rank is there; that rank's timing is the link's.
        least = self.backend.all_reduce([tf.constant(self._observer.transfer_seconds())], ReduceOp.MIN, "caramel_least")[0]
        link = self._observer.model(previous=self.link, transfer_seconds=least.numpy())
        measured = typical_backward_seconds(self._recent)
        tensors = measured_costs(self._tensors, measured) if measured else self._tensors
        search = Search(tensors, link, self.scheduling, self.steps_per_execution, self.policy) if self.backend.rank == 0 else None
        self._search_start_seconds = time.perf_counter() - started
        return _PendingSearch(completed_steps + PLAN_LAG_STEPS, link, tensors, search)

    def _search_done(self, pending: _PendingSearch) -> bool:
        """Whether rank 0's search has ended, on every rank. The search runs at the lowest
        priority beside the steps, and may not have had the CPU to end by the time its plan is
        due: the decision then waits for a later boundary rather than the steps for the search."""
        self.communicated = True
        done = pending.search is not None and pending.search.done()
        return bool(self.backend.broadcast([tf.constant(int(done))], root_rank=0, name="caramel_search_done")[0].numpy())

    def _adopt(self, pending: _PendingSearch, completed_steps: int, steps_left: int | None, first: bool = False) -> bool:
        """Rank 0 decides from its search and its measurements; every rank takes its decision.
        The `first` measured plan also decides whether the steps go on to several per graph."""
        self.communicated = True
        self.decided_at.append(completed_steps)
        started = time.perf_counter()
        chosen, several = None, self.several_steps
        if pending.search is not None:
            try:
                found = pending.search.result()
            except RuntimeError as error:  # a failed search costs a re-plan, not the training
                print(f"caramel: {error}; keeping the plan in force", file=sys.stderr, flush=True)
            else:
                if first:  # steps that run Caramel's graph already (MULTITREE's trees need it) go on in it
                    own_way = simulate(pending.tensors, own_way_transfers(pending.tensors, pending.link, self.backend.own_way_fusion_bytes), pending.link, 1)
                    several = self.several_steps or self.worth_several_steps(found, steps_left, own_way)
                    chosen = found if several and found.transfers != self.in_force.transfers else None
                else:
                    current = simulate(pending.tensors, self.in_force.transfers, pending.link, self.steps_per_execution)
                    if found.transfers != self.in_force.transfers and found.predicted_step_seconds <= current * (1 - MIN_GAIN):
                        chosen = self._worth_retracing(found, current, steps_left)
        self._tensors = pending.tensors
        # What this re-plan cost rank 0, whose measure is shared: starting the search, the steps'
        # time the search took beside them, and this decision.
        replan_seconds = self._search_start_seconds + self._beside_seconds + time.perf_counter() - started
        self._beside_seconds = 0.0
        interval = replan_interval(self.scheduling.replan_interval_steps, replan_seconds, self.seconds_per_step)
        previous_interval = self._interval_steps
        self.link, chosen, self._interval_steps, self.several_steps = _share_decision(self.backend, pending.link, chosen, interval, several)
        # Steps kept one per graph are not re-planned: no interval to speak of.
        if self.several_steps and self._interval_steps != previous_interval and self.seconds_per_step is not None and self.backend.rank == 0:
            print(
                f"caramel: re-planning every {self._interval_steps} steps (a re-plan costs {replan_seconds * 1e3:.4g} ms at "
                f"steps of {self.seconds_per_step * 1e3:.4g} ms; spec.caramel.replanIntervalSteps is the least)",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        if chosen is None:
            return False
        self.plan, self.plan_link = chosen, self.link
        self.version += 1
        self.plan_changes += 1
        return True

    def worth_several_steps(self, found: Plan, steps_left: int | None, own_way_seconds: float) -> bool:
        """Whether the plan found, several steps per graph, repays building those graphs (the
        estimate in `retrace_seconds`) within the steps left, against the steps so far: the
        backend's own way, one per graph, measured at `seconds_per_step` and predicted by the
        same model as the plan at `own_way_seconds`. The gain is the model's difference between
        the two, never more than the measured step leaves: the model misses what slows every
        way alike (the ranks' compute skew, the CPU that collectives cost), so its step is
        optimistic, and a measured step against a predicted one would credit the plan with the
        model's error (on an emulated ResNet-50 at 4 Gbit/s, 0.29-0.31 s per step predicted
        where 0.06-0.13 s came: benchmarks/results/2026-12-07-zoo-jobs200-input-pipeline.txt).
        Where nobody said how many steps are left, the steps per execution asked for are taken
        as they are."""
        if self.policy.long_training or self.seconds_per_step is None or steps_left is None:
            return True
        gain = min(self.seconds_per_step, own_way_seconds) - found.predicted_step_seconds
        basis = (
            f" (the plan {found.predicted_step_seconds * 1e3:.4g} ms, {self.backend.own_way_name} "
            f"{own_way_seconds * 1e3:.4g} ms predicted and {self.seconds_per_step * 1e3:.4g} ms measured)"
        )
        if not self._repays_rebuild(gain, steps_left, "one step per graph", basis):
            return False
        build = "" if self.retrace_seconds is None else f", repaying its build ({self.retrace_seconds:.3g} s) within the {steps_left} steps left"
        print(f"caramel: going on to several steps per graph: predicted {gain * 1e3:.3g} ms faster per step{basis}{build}", file=sys.stderr, flush=True)
        return True

    def _worth_retracing(self, found: Plan, current_seconds: float, steps_left: int | None) -> Plan | None:
        """The plan found, unless its gain would not repay the re-trace."""
        return found if self._repays_rebuild(current_seconds - found.predicted_step_seconds, steps_left, "the plan in force") else None

    def _repays_rebuild(self, gain_seconds: float, steps_left: int | None, kept: str, basis: str = "") -> bool:
        """Whether a predicted gain per step repays the rebuild it costs (`retrace_seconds`)
        within the steps left (PAYBACK_STEPS where unknown); rank 0's log says what is kept
        where it does not, and the `basis` of the gain."""
        if repays_retrace(gain_seconds, self.retrace_seconds, steps_left):
            return True
        if abs(gain_seconds) < 0.5e-6:  # a plan that is the own way (a lone rank sends nothing)
            why = f"the change is predicted no faster per step{basis}"
        elif gain_seconds < 0:
            why = f"the change is predicted {-gain_seconds * 1e3:.3g} ms slower per step{basis}"
        else:
            steps = f"the {steps_left} steps left" if steps_left is not None else f"{PAYBACK_STEPS} steps"
            why = (
                f"predicted {gain_seconds * 1e3:.3g} ms faster per step{basis}, the change would not repay its "
                f"rebuild ({self.retrace_seconds:.3g} s) within {steps}"
            )
        print(f"caramel: keeping {kept}: {why}", file=sys.stderr, flush=True)
        return False

    def _probe(self) -> None:
        """Time a few back-to-back collectives; the first of each size also lines the ranks up."""
        self._observer.new_probe_round()
        for elements, repeats in PROBES:
            probe = tf.ones([elements], dtype=tf.float32)
            for _ in range(repeats + 1):
                started = time.perf_counter()
                self.probe_allreduce(probe)
                self._observer.observe_probe(elements * 4, time.perf_counter() - started)


def _share_decision(
    backend: Backend, link: LinkModel, plan: Plan | None, interval_steps: int, several_steps: bool
) -> tuple[LinkModel, Plan | None, int, bool]:
    """Rank 0's link model, chosen plan (or None), steps to the next re-plan and whether the
    steps run several per graph, on every rank."""
    document = plan_document(plan) if plan else None
    transfers = document["transfers"] if document else []
    batch = document["batch"] if document else {"min_bytes": 0, "max_bytes": 0, "chunk_bytes": 0, "deadline_span_seconds": 0.0}
    header = [
        link.alpha, link.beta, float(plan is not None), document["predicted"] if document else 0.0, len(transfers), interval_steps,
        float(several_steps), *batch.values(),
    ]  # fmt: skip
    header = backend.broadcast([tf.constant(header, tf.float64)], root_rank=0, name="caramel_plan_header")[0].numpy()
    shared_link, shared_interval, shared_several = LinkModel(alpha=float(header[0]), beta=float(header[1])), int(header[5]), bool(header[6])
    if not header[2]:
        return shared_link, None, shared_interval, shared_several
    values = backend.broadcast([tf.constant(transfers or [0] * int(header[4]), tf.int64)], root_rank=0, name="caramel_plan")[0].numpy()
    batch = dict(zip(batch, (int(header[7]), int(header[8]), int(header[9]), float(header[10]))))
    plan = plan_from({"transfers": values.tolist(), "batch": batch, "predicted": float(header[3])})
    return shared_link, plan, shared_interval, shared_several
