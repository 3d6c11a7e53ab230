"""A lone Horovod rank for tests/test_replan_schedule.py: drives the real `Replanner` through
the execution boundaries of a training run at several steps per execution, with real probes
and plan searches, and prints at which completed step it decided each plan, as JSON
{steps_per_execution: [steps]}.

The steps' timings are made up (every gradient's backward pass and transfer take the same
time); only when the replanner decides is read, not what.
"""

from __future__ import annotations

import json

import horovod.tensorflow as hvd

from caramel.job.api import Scheduling
from caramel.planner.linkmodel import LinkModel
from caramel.planner.timing import StepTimes, TransferTiming
from caramel.tensorflow.replanner import Replanner

GRADIENT_SIZES = [(64 * 1024 * 4, 4)] * 8  # eight float32 gradients of 64 Ki elements
STEPS = 60  # past the second decision at every steps per execution below
STEPS_PER_EXECUTION = (1, 4, 8)


def decision_steps(steps_per_execution: int) -> list[int]:
    replanner = Replanner(Scheduling(), LinkModel(alpha=1e-4, beta=1e-9))
    replanner.plan_for(GRADIENT_SIZES)
    decided = []
    adopt = replanner._adopt

    def recording_adopt(*args, **kwargs) -> bool:
        decided.append(completed)
        return adopt(*args, **kwargs)

    replanner._adopt = recording_adopt
    step = StepTimes(
        transfers=tuple(TransferTiming(nbytes, 0.002) for nbytes, _ in GRADIENT_SIZES),
        backward_seconds=(0.01,) * len(GRADIENT_SIZES),
        communication_seconds=0.016,
        transfer_wait_seconds=0.0,
        exposed_seconds=0.0,
    )
    for completed in range(steps_per_execution, STEPS + 1, steps_per_execution):
        replanner.observe([step] * steps_per_execution)
        replanner.at_boundary(completed, steps_left=10_000)
    return decided


def main() -> None:
    hvd.init()
    print(json.dumps({spe: decision_steps(spe) for spe in STEPS_PER_EXECUTION}), flush=True)


if __name__ == "__main__":
    main()
