"""When the Replanner decides, driven through its real boundaries (testbed/replan_schedule_worker.py,
one Horovod rank): the first measured plan at the first boundary, as `caramel.planner.rounds`
assumes for the arm selector's first round (and the bench for its warm-up); the next one a
re-plan interval later, adopted PLAN_LAG_STEPS after its search started."""

from __future__ import annotations

import json
import subprocess
import sys

from caramel.job.api import Scheduling
from caramel.planner.schedule import PLAN_LAG_STEPS
from conftest import REPO


def first_boundary_from(step: int, steps_per_execution: int) -> int:
    return -(-step // steps_per_execution) * steps_per_execution


def test_plans_are_decided_at_the_first_boundary_then_every_interval():
    result = subprocess.run(
        [sys.executable, "-m", "testbed.replan_schedule_worker"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    decided = {int(spe): steps for spe, steps in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    interval = Scheduling().replan_interval_steps
    for steps_per_execution, steps in decided.items():
        assert steps[0] == steps_per_execution, decided
        searched = first_boundary_from(steps[0] + interval, steps_per_execution)
        assert steps[1] == first_boundary_from(searched + PLAN_LAG_STEPS, steps_per_execution), decided
