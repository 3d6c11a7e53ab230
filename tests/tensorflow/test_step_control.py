"""The decisions between executions (`caramel.tensorflow.step_control`): what each execution of a
step function runs, driven as `StepFunction` drives it, on a backend of one rank. The steps these
decisions are for are run end to end in tests/tensorflow/test_correctness.py and tests/tensorflow/test_overlap_graph.py."""

from __future__ import annotations

import pytest

from caramel.contract.api import CaramelJob
from caramel.contract.env import WorkerContract, slot_env, worker_env
from caramel.planner.linkmodel import LinkModel
from caramel.tensorflow.graph_choice import CARAMEL, OWN_GRAPH
from caramel.tensorflow.selector import EXPLORED, UNTIMED
from caramel.tensorflow.step_control import Regime, StepControl, builds_of_caramels_graph

GRADIENTS = [(4096 * 4, 4)] * 3


@pytest.fixture
def stopped_stamping() -> list[bool]:
    """Each time the control stopped the own graph's stamps of its gradients' releases."""
    return []


@pytest.fixture
def control(one_rank, stopped_stamping) -> StepControl:
    job = CaramelJob.model_validate(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "control"},
         "spec": {"script": "train.py", "workers": {"replicas": 1}}}
    )  # fmt: skip
    env = worker_env(job, 0, ["a"])
    made = StepControl(WorkerContract.from_env({**env, **slot_env(env, 0)}), one_rank, LinkModel(alpha=1e-4, beta=1e-9), lambda: stopped_stamping.append(True))
    made.replanner.plan_for(GRADIENTS)  # as the first trace of the step does
    return made


def test_one_step_per_graph_runs_the_own_graph_and_decides_nothing(control):
    execution = control.at_boundary(0, None, steps_per_execution=1, steps=1, own_first_call_seconds=None, caramels_graph_failed=False)
    assert (execution.graph, execution.regime, execution.retrace) == (OWN_GRAPH, Regime.ONE_PER_GRAPH, False)
    control.executed(execution, 1, 1, 1, 0.2, 0.2)
    assert control.replanner.seconds_per_step is None and control.replanner.steps_per_execution is None


def test_until_the_first_plan_the_own_graph_runs_timed_for_the_replanner(control, stopped_stamping):
    control.use_algorithm("ring")
    execution = control.at_boundary(0, 100, steps_per_execution=4, steps=4, own_first_call_seconds=None, caramels_graph_failed=False)
    assert (execution.graph, execution.regime) == (OWN_GRAPH, Regime.OWN_GRAPH_ONLY)
    assert control.replanner.steps_per_execution == 4  # told at the boundary, for the plans' predictions
    control.executed(execution, 4, 4, timed_steps=3, timed_seconds=0.3, seconds=0.3)  # the first call built the graph
    assert control.replanner.seconds_per_step == pytest.approx(0.1)
    # The own graph's first call cost 1.1 s, a step 0.1 s: building Caramel's graph of 4 steps is
    # weighed as 3 such builds, its step optimized once (no GPU here).
    control.at_boundary(4, 96, steps_per_execution=4, steps=4, own_first_call_seconds=1.1, caramels_graph_failed=False)
    assert control.replanner.retrace_seconds == pytest.approx(3.0)
    assert control.wants_releases and not stopped_stamping


def test_multitrees_gradients_run_caramels_graph_whatever_it_costs(control):
    control.use_algorithm("multitree")
    execution = control.at_boundary(0, 100, steps_per_execution=4, steps=4, own_first_call_seconds=1.1, caramels_graph_failed=False)
    assert control.replanner.several_steps
    assert (execution.graph, execution.regime) == (CARAMEL, Regime.GRAPH_CHOICE)
    failed = control.at_boundary(4, 96, steps_per_execution=4, steps=4, own_first_call_seconds=1.1, caramels_graph_failed=True)
    assert (failed.graph, failed.regime) == (OWN_GRAPH, Regime.OWN_GRAPH_ONLY)  # a graph that could not be built is not tried again


def test_a_short_execution_runs_the_own_graph_and_its_time_counts_for_neither_arm(control):
    control.use_algorithm("ring")
    control.replanner.require_several_steps()  # as a measured first plan that repays Caramel's graph decides
    control.replanner.measured = True
    short = control.at_boundary(8, 2, steps_per_execution=4, steps=2, own_first_call_seconds=1.1, caramels_graph_failed=False)
    assert (short.graph, short.regime, short.regular) == (OWN_GRAPH, Regime.GRAPH_CHOICE, False)
    control.selector.last_kind.assign(EXPLORED)
    control.executed(short, 10, 2, 2, 0.2, 0.2)
    assert int(control.selector.last_kind.numpy()) == UNTIMED  # the step under way counts for neither arm
    assert control.graphs.running == CARAMEL  # only full executions count in the graph choice


@pytest.mark.parametrize(("optimized_once", "builds"), [(True, 3.0), (False, 5.0)])
def test_a_graph_of_four_steps_is_weighed_in_builds_of_the_own_graph(optimized_once, builds):
    # Optimized once, the trace and grappler are paid once and each copy adds half a build;
    # optimized whole, each copy costs a build.
    assert builds_of_caramels_graph(4, optimized_once) == builds
