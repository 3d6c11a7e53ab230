"""A lone rank for tests/tensorflow/test_replan_schedule.py: drives the real `Replanner` through
the execution boundaries of a training run at several steps per execution, with real probes
and plan searches, and prints at which completed step it decided each plan, as JSON
{"decided": {steps_per_execution: [steps]}, "back_to_back": [steps], "beside": [steps]}: "decided"
and "back_to_back" with the first plan's search waited for (the planning policy's `first_plan_waits`,
as the benchmarks and tests run), the latter where boundaries come back to back while a search
runs; "beside" with boundaries back to back and the first plan's search beside them, as in a job.

The steps' timings are made up (every gradient's backward pass and transfer take the same
time); only when the replanner decides is read, not what.
"""

from __future__ import annotations

import json
import time

from caramel.collectives.tensorflow_backend import TensorFlowBackend
from caramel.contract.api import Scheduling
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import PlanningPolicy
from caramel.planner.timing import StepTimes, TransferTiming
from caramel.tensorflow.replanner import Replanner

GRADIENT_SIZES = [(64 * 1024 * 4, 4)] * 8  # eight float32 gradients of 64 Ki elements
GIVE_UP_SECONDS = 60  # a second decision long after this is a failure the test reports
STEPS_PER_EXECUTION = (1, 4, 8)


def decision_steps(steps_per_execution: int, search_ends_first: bool = True, first_plan_waits: bool = True) -> list[int]:
    """The steps at which the replanner decided. With `search_ends_first`, each boundary comes only once a running search has ended, as
    where steps take longer than a search; without, boundaries come back to back."""
    policy = PlanningPolicy(first_plan_waits=first_plan_waits)
    replanner = Replanner(Scheduling(), LinkModel(alpha=1e-4, beta=1e-9), TensorFlowBackend(0, 1, 0, 1, timeout_seconds=10.0), policy)
    replanner.plan_for(GRADIENT_SIZES)
    step = StepTimes(
        transfers=tuple(TransferTiming(nbytes, 0.002) for nbytes, _ in GRADIENT_SIZES),
        backward_seconds=(0.01,) * len(GRADIENT_SIZES),
        communication_seconds=0.016,
        transfer_wait_seconds=0.0,
        exposed_seconds=0.0,
    )
    completed, deadline = 0, time.monotonic() + GIVE_UP_SECONDS
    while len(replanner.decided_at) < 2 and time.monotonic() < deadline:
        completed += steps_per_execution
        replanner.observe([step] * steps_per_execution)
        while search_ends_first and replanner.searching:
            time.sleep(0.01)
        if not search_ends_first:
            time.sleep(0.01)  # a short step, beside the search
        replanner.at_boundary(completed, steps_per_execution, steps_left=10_000)
    return replanner.decided_at


def main() -> None:
    decided = {spe: decision_steps(spe) for spe in STEPS_PER_EXECUTION}
    back_to_back, beside = decision_steps(4, search_ends_first=False), decision_steps(4, search_ends_first=False, first_plan_waits=False)
    print(json.dumps({"decided": decided, "back_to_back": back_to_back, "beside": beside}), flush=True)


if __name__ == "__main__":
    main()
