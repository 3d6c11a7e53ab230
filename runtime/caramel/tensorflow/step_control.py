"""What the next execution of a step function runs: the one owner of the decisions taken between
executions.

Three parts decide how a step's gradients travel, each measuring something of its own: the
replanner (replanner.py) the plan in force, and whether the steps run several per graph at all;
the arm selector (selector.py), inside Caramel's graph, the plan against the backend's own way;
the graph choice (graph_choice.py), Caramel's graph of several steps against the backend's own
graph of one step. Their decisions depend on each other (no search while the selector measures,
a new plan restarts the selector's round, the selector's new choice restarts the graphs'), so
they are taken here, in one place, at every execution boundary, on every rank alike: the step
function (steps.py) asks `at_boundary` what to run, runs it, and reports it with `executed`.
Everything here runs between executions, in Python, never inside a step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from caramel.collectives.backend import Backend
from caramel.contract.env import WorkerContract
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import PlanningPolicy
from caramel.planner.rounds import MIN_BLOCK_STEPS, block_steps
from caramel.tensorflow.graph_choice import CARAMEL, OWN_GRAPH, GraphChoice
from caramel.tensorflow.replanner import ProbeAllreduce, Replanner
from caramel.tensorflow.selector import ArmSelector
from caramel.tensorflow.step_optimization import optimizes_once


class Regime(Enum):
    """How the steps of a step function run, as decided so far."""

    ONE_PER_GRAPH = "one step per graph"
    """steps_per_execution 1: the backend's own graph alone; no order of the transfers has a
    window to gain in, and nothing is planned."""
    OWN_GRAPH_ONLY = "own graph only"
    """Until the first measured plan, or where it did not repay Caramel's graph (or that graph
    could not be built): the backend's own graph of one step, timed for the replanner."""
    GRAPH_CHOICE = "graph choice"
    """Caramel's graph of several steps, measured against the backend's own graph."""


@dataclass(frozen=True)
class Execution:
    """What the next steps run, as `StepControl.at_boundary` decided."""

    graph: str
    """OWN_GRAPH (the backend's own graph of one step, called once per step) or CARAMEL
    (Caramel's graph of the steps, one call)."""
    retrace: bool
    """A new plan is in force: Caramel's graph, traced and built for the old one, is stale."""
    regime: Regime
    regular: bool
    """The execution runs the full steps_per_execution (not the end of an epoch or a training)."""


class StepControl:
    """The decisions between executions (see the module's docstring): it alone drives the
    replanner, the arm selector and the graph choice, which the communicator reads while the step
    is traced."""

    def __init__(
        self,
        contract: WorkerContract,
        backend: Backend,
        link: LinkModel,
        stop_stamping_releases: Callable[[], None],
        policy: PlanningPolicy = PlanningPolicy(),
    ) -> None:
        self._backend = backend
        self.replanner = Replanner(contract.scheduling, link, backend, policy)
        self.selector = ArmSelector(backend)
        self.graphs = GraphChoice(MIN_BLOCK_STEPS, backend)
        self._stop_stamping_releases = stop_stamping_releases
        """Called once the first plan is decided: the own graph's stamps of its gradients'
        releases, which that plan was searched from, are needed no more."""
        self._algorithm: str | None = None
        self._selector_decisions = 0
        """The selector's decisions already answered with a round of the graph choice."""

    def use_algorithm(self, algorithm: str, probe: ProbeAllreduce | None = None) -> None:
        """The gradients go by `algorithm` (ring, or multitree: MULTITREE's trees, which only
        Caramel's graph uses); `probe` is the all-reduce the plans' link is timed on, where it is
        not the backend's."""
        self._algorithm = algorithm
        if probe is not None:
            self.replanner.probe_allreduce = probe

    @property
    def wants_releases(self) -> bool:
        """Whether the own graph's steps should hand their gradients' releases over (until the
        first plan is decided)."""
        return not self.replanner.measured

    def describe_plan(self) -> str:
        return self.replanner.describe()

    def at_boundary(
        self,
        completed_steps: int,
        steps_left: int | None,
        steps_per_execution: int,
        steps: int,
        own_first_call_seconds: float | None,
        caramels_graph_failed: bool,
    ) -> Execution:
        """Before an execution of `steps` steps (at most `steps_per_execution`), on every rank at
        the same step count: re-plan where due, and say what the steps run."""
        if steps_per_execution == 1:
            return Execution(OWN_GRAPH, retrace=False, regime=Regime.ONE_PER_GRAPH, regular=True)
        replanner, selector, graphs = self.replanner, self.selector, self.graphs
        self._weigh_caramels_graph(steps_per_execution, own_first_call_seconds)
        several_before, measured_before = replanner.several_steps, replanner.measured
        # No search while the selector measures (a new plan would restart its round), nor while
        # the own graph runs blocks beside Caramel's (it stamps nothing to plan from).
        may_search = replanner.several_steps and not selector.exploring and graphs.running == CARAMEL
        replanned = replanner.at_boundary(completed_steps, steps_per_execution, steps_left, may_search=may_search)
        if replanner.communicated:
            selector.untime_last_step()  # the re-plan's time is neither arm's
        if replanned or replanner.several_steps != several_before:
            # The first execution of the new graphs builds them: it is not measured.
            block = block_steps(steps_per_execution)
            selector.set_block(block)
            graphs.set_block(block)
            selector.start_round(settle=steps_per_execution)
            if self._backend.rank == 0:
                print(f"caramel: from step {completed_steps + 1}, {replanner.describe()}", file=sys.stderr, flush=True)
        if replanner.measured and not measured_before:
            self._stop_stamping_releases()
        regular = steps == steps_per_execution
        if not replanner.several_steps or caramels_graph_failed:
            return Execution(OWN_GRAPH, retrace=replanned, regime=Regime.OWN_GRAPH_ONLY, regular=regular)
        return Execution(self._next_graph(regular, steps_per_execution), retrace=replanned, regime=Regime.GRAPH_CHOICE, regular=regular)

    def executed(self, execution: Execution, completed_steps: int, steps: int, timed_steps: int, timed_seconds: float, seconds: float) -> None:
        """The execution decided at the last boundary ran `steps` steps in `seconds`, ending at
        `completed_steps`; `timed_steps` of them built nothing and took `timed_seconds`."""
        replanner = self.replanner
        if execution.regime is Regime.ONE_PER_GRAPH:
            return
        if execution.regime is Regime.OWN_GRAPH_ONLY:
            if timed_steps:
                replanner.executed(timed_steps, timed_seconds)
            return
        if execution.graph == CARAMEL and execution.regular:
            if timed_steps:
                replanner.executed(steps, timed_seconds)  # what the steps take, as re-plans are weighed
            elif replanner.seconds_per_step is not None:
                replanner.rebuild_cost(max(0.0, seconds - steps * replanner.seconds_per_step))  # what adopting a plan cost
        if execution.regular:
            outcome = self.graphs.ran(execution.graph, steps, timed_steps, timed_seconds)
            if outcome and self._backend.rank == 0:
                print(f"caramel: at step {completed_steps}, {outcome}", file=sys.stderr, flush=True)
        elif execution.graph == OWN_GRAPH:
            self.selector.untime_last_step()  # its last tick was before these steps

    def _weigh_caramels_graph(self, steps_per_execution: int, own_first_call_seconds: float | None) -> None:
        """Before the first measured plan: what the replanner weighs its gain against (what
        building Caramel's graph of several steps will cost, in builds of the own graph:
        `builds_of_caramels_graph`), and whether the steps must run Caramel's graph whatever it
        costs (the gradients go through MULTITREE's trees, which only Caramel's graph uses)."""
        replanner = self.replanner
        if replanner.measured or own_first_call_seconds is None:
            return
        if replanner.seconds_per_step is not None:
            own_build = max(0.0, own_first_call_seconds - replanner.seconds_per_step)
            replanner.rebuild_cost(builds_of_caramels_graph(steps_per_execution, optimizes_once()) * own_build)
        if self._algorithm not in (None, "ring"):
            replanner.require_several_steps()

    def _next_graph(self, regular: bool, steps_per_execution: int) -> str:
        """The graph the next steps run (graph_choice.py): the own graph for executions shorter
        than the rest (the end of an epoch or of the training), whose graph of several steps
        would cost more to build than its steps can gain; Caramel's where the gradients go
        through MULTITREE's trees, which the own graph does not use."""
        selector, graphs = self.selector, self.graphs
        if self._algorithm != "ring":
            return CARAMEL
        if not regular:
            return OWN_GRAPH
        decisions = int(selector.decisions.numpy())
        if decisions != self._selector_decisions and not graphs.measuring and graphs.chosen == CARAMEL:
            graphs.start_round()  # the selector chose anew: against the own graph again
        self._selector_decisions = decisions
        graph = graphs.next_graph()
        if graph == CARAMEL and graphs.running == OWN_GRAPH:
            # Back from the own graph: the selector's last tick was before it, and its step
            # counts for nothing; after a spell of it, the selector measures both arms again.
            selector.untime_last_step()
            if not graphs.measuring:
                selector.start_round(settle=steps_per_execution)
        return graph


def builds_of_caramels_graph(steps_per_execution: int, optimized_once: bool) -> float:
    """What building Caramel's graph of `steps_per_execution` steps costs, in builds of the own
    graph of one step (each its trace, grappler's optimization and first run). The step is traced
    once, with both ways to send its gradients, and copied once per step. Where grappler optimizes
    the whole graph, each copy costs about what the own graph's build did. Where the step is
    optimized once, on its own (step_optimization.py), the trace and the optimization are paid
    once and each copy adds about half a build, its instantiation and first run: on the emulated
    DenseNet-121 at 4 steps per graph, 2.9 and 3.2 builds of the own graph, measured, where
    grappler on the whole graph took 7 (benchmarks/results/2026-12-05-step-optimized-once.txt)."""
    return 1 + steps_per_execution / 2 if optimized_once else steps_per_execution + 1


__all__ = ["Execution", "Regime", "StepControl", "builds_of_caramels_graph"]
