"""When the Replanner decides, driven through its real boundaries (testbed/replan_schedule_worker.py,
one rank): where the first plan's search is waited for (the benchmarks' and tests' lab setting), the
first measured plan at the first boundary, as `caramel.planner.rounds` assumes for the arm
selector's first round (and the bench for its warm-up); otherwise at the first boundary after its
search ended, beside the steps; the next one a re-plan interval later, adopted PLAN_LAG_STEPS after
its search started."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from caramel.contract.api import Scheduling
from caramel.planner.policy import PlanningPolicy
from caramel.planner.schedule import PLAN_LAG_STEPS
from conftest import REPO


def first_boundary_from(step: int, steps_per_execution: int) -> int:
    return -(-step // steps_per_execution) * steps_per_execution


def test_plans_are_decided_at_the_first_boundary_then_every_interval():
    result = subprocess.run(
        [sys.executable, "-m", "testbed.replan_schedule_worker"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    decided = {int(spe): steps for spe, steps in report["decided"].items()}
    interval = Scheduling().replan_interval_steps
    for steps_per_execution, steps in decided.items():
        assert steps[0] == steps_per_execution, decided
        searched = first_boundary_from(steps[0] + interval, steps_per_execution)
        assert steps[1] == first_boundary_from(searched + PLAN_LAG_STEPS, steps_per_execution), decided
    # Boundaries that come while the search still runs do not wait for it: its decision comes at
    # a later one than where it was due (a search process takes far longer to start and end than
    # the two boundaries, 10 ms apart, between its start and that step). The first measured plan
    # is waited for.
    back_to_back = report["back_to_back"]
    assert back_to_back[0] == 4 and back_to_back[1] > decided[4][1], report
    # In a job the first plan's search runs beside the steps too: decided at a later boundary.
    assert report["beside"][0] > 4, report


def test_several_steps_per_graph_only_where_the_steps_left_repay_their_build(one_rank, capsys):
    from caramel.planner.linkmodel import LinkModel
    from caramel.planner.schedule import Batch, Plan
    from caramel.tensorflow.replanner import Replanner

    replanner = Replanner(Scheduling(), LinkModel(alpha=1e-3, beta=1e-9), one_rank)
    replanner.seconds_per_step, replanner.retrace_seconds = 0.5, 20.0  # one step per graph; the estimated build
    plan = Plan((), Batch(0, 0, 0), predicted_step_seconds=0.45)  # 50 ms faster a step
    assert not replanner.worth_several_steps(plan, steps_left=200, own_way_seconds=0.5)  # 10 s gained: less than the build
    assert (
        "keeping one step per graph: predicted 50 ms faster per step (the plan 450 ms, TensorFlow's collectives in buckets "
        "as the gradients come 500 ms predicted and 500 ms measured), the change would not repay its rebuild (20 s) within "
        "the 200 steps left"
    ) in capsys.readouterr().err
    assert replanner.worth_several_steps(plan, steps_left=1000, own_way_seconds=0.5)  # 50 s
    assert replanner.worth_several_steps(plan, steps_left=None, own_way_seconds=0.5)  # not said: as many steps per graph as asked
    slower = Plan((), Batch(0, 0, 0), predicted_step_seconds=0.55)
    assert not replanner.worth_several_steps(slower, steps_left=10**6, own_way_seconds=0.5)
    assert "keeping one step per graph: the change is predicted 50 ms slower per step" in capsys.readouterr().err
    same = Plan((), Batch(0, 0, 0), predicted_step_seconds=0.5 + 1e-12)  # the own way, as a lone rank's plan is
    assert not replanner.worth_several_steps(same, steps_left=10**6, own_way_seconds=0.5)
    assert "keeping one step per graph: the change is predicted no faster per step (the plan 500 ms" in capsys.readouterr().err
    # As a benchmark's few steps stand for a long training's, by the policy it plans with.
    long_training = Replanner(Scheduling(), LinkModel(alpha=1e-3, beta=1e-9), one_rank, PlanningPolicy(long_training=True))
    long_training.seconds_per_step, long_training.retrace_seconds = replanner.seconds_per_step, replanner.retrace_seconds
    assert long_training.worth_several_steps(plan, steps_left=200, own_way_seconds=0.5)


def test_the_gain_that_must_repay_the_build_is_the_models_difference_where_it_is_optimistic(one_rank, capsys):
    from caramel.planner.linkmodel import LinkModel
    from caramel.planner.schedule import Batch, Plan
    from caramel.tensorflow.replanner import Replanner

    replanner = Replanner(Scheduling(), LinkModel(alpha=1e-3, beta=1e-9), one_rank)
    replanner.seconds_per_step, replanner.retrace_seconds = 0.9, 20.0
    plan = Plan((), Batch(0, 0, 0), predicted_step_seconds=0.6)
    # The model predicts the own way 0.2 s faster than it measures (what it misses slows every
    # way alike): the plan gains 0.1 s a step, not 0.3 s, and 150 steps do not repay the build.
    assert not replanner.worth_several_steps(plan, steps_left=150, own_way_seconds=0.7)
    assert "predicted 100 ms faster per step (the plan 600 ms, " in capsys.readouterr().err
    assert replanner.worth_several_steps(plan, steps_left=250, own_way_seconds=0.7)  # 25 s
    assert "going on to several steps per graph: predicted 100 ms faster per step (the plan 600 ms, " in capsys.readouterr().err
    # A model pessimistic about the own way credits no more than the measured step leaves.
    assert not replanner.worth_several_steps(plan, steps_left=60, own_way_seconds=1.2)  # 0.3 s x 60 = 18 s
    assert replanner.worth_several_steps(plan, steps_left=70, own_way_seconds=1.2)  # 21 s


def test_the_steps_time_a_search_took_beside_them_counts_as_the_re_plans_cost(one_rank):
    from caramel.planner.linkmodel import LinkModel
    from caramel.tensorflow.replanner import Replanner

    replanner = Replanner(Scheduling(), LinkModel(alpha=1e-3, beta=1e-9), one_rank)
    replanner.executed(4, 0.4)  # no search running: the usual step
    assert replanner.seconds_per_step == pytest.approx(0.1)
    replanner._pending = object()  # noqa: SLF001 (a search runs beside the next executions)
    replanner.executed(4, 0.6)
    replanner.executed(4, 0.38)  # faster than usual: no credit
    assert replanner.seconds_per_step == pytest.approx(0.1)  # the usual step, not the slowed one
    assert replanner._beside_seconds == pytest.approx(0.2)  # noqa: SLF001


def test_the_plan_is_described_with_the_link_it_was_made_for(one_rank):
    """A re-plan that keeps the plan in force measures the link again; the plan's description
    (its predicted step) stays with the link it was made for."""
    from caramel.planner.linkmodel import LinkModel
    from caramel.tensorflow.replanner import Replanner

    made_for = LinkModel(alpha=1e-3, beta=1e-8)  # 100 MB/s
    replanner = Replanner(Scheduling(), made_for, one_rank)
    replanner.plan_for([(4 << 20, 4), (1 << 20, 4)])
    replanner.link = LinkModel(alpha=2e-3, beta=2e-8)  # as a later re-plan that kept the plan measured it
    assert replanner.plan_link == made_for
    assert replanner.describe().endswith("link alpha 1 ms, 100 MB/s")
