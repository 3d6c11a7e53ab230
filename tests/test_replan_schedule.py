"""`early_replan_settled_step`, from which the bench measures, restates when the Replanner
decides its early re-plan. Driven through the real Replanner's boundaries
(testbed/replan_schedule_worker.py, one Horovod rank), the last plan that can re-trace must be
decided one execution before the step it names."""

from __future__ import annotations

import json
import subprocess
import sys

from caramel.planner.schedule import early_replan_settled_step
from conftest import REPO


def test_the_early_replan_is_decided_one_execution_before_the_settled_step():
    result = subprocess.run(
        [sys.executable, "-m", "testbed.replan_schedule_worker"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    decided = {int(spe): steps for spe, steps in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    for steps_per_execution, steps in decided.items():
        # The first measured plan at the first boundary, then the early re-plan.
        assert steps[0] == steps_per_execution, decided
        assert steps[1] + steps_per_execution == early_replan_settled_step(steps_per_execution), decided
