"""The plan search as a process of its own: `python -m caramel.planner.search`, a JSON request on
stdin, the best plan as JSON on stdout.

A training process starts it for each re-plan, on rank 0 only: the search (a few tenths of a
second to seconds of pure Python) then runs beside training without taking the training
process's interpreter lock, which the emulated accelerator, callbacks and the input pipeline's
Python need, and costs the job's CPU once instead of once per rank. It runs at the lowest
priority: a search that competed with the ranks for a busy CPU made the steps it ran beside
slower than any plan could make up for. Training waits for it only for the first measured plan;
a later one is decided at the first execution boundary after it has ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from caramel.contract.api import Scheduling
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import POLICY, PlanningPolicy
from caramel.planner.schedule import Batch, Plan, TensorCost, best_schedule
from caramel.planner.transfers import decode, encode


def request(
    tensors: Sequence[TensorCost], link: LinkModel, scheduling: Scheduling, policy: PlanningPolicy, steps_per_execution: int | None
) -> str:
    return json.dumps(
        {
            "tensors": [asdict(t) for t in tensors],
            "link": asdict(link),
            "scheduling": scheduling.model_dump(mode="json", by_alias=True),
            "policy": POLICY.dump_python(policy, mode="json"),
            "steps_per_execution": steps_per_execution,
        }
    )


def answer(text: str) -> str:
    document = json.loads(text)
    plan = best_schedule(
        [TensorCost(**t) for t in document["tensors"]], LinkModel(**document["link"]), Scheduling.model_validate(document["scheduling"]),
        document["steps_per_execution"], POLICY.validate_python(document["policy"]),
    )  # fmt: skip
    return json.dumps(plan_document(plan))


def plan_document(plan: Plan) -> dict[str, Any]:
    return {"transfers": encode(plan.transfers), "batch": asdict(plan.batch), "predicted": plan.predicted_step_seconds}


def plan_from(document: dict[str, Any]) -> Plan:
    return Plan(decode(document["transfers"]), Batch(**document["batch"]), document["predicted"])


class Search:
    """One search running in its own process."""

    def __init__(
        self,
        tensors: Sequence[TensorCost],
        link: LinkModel,
        scheduling: Scheduling,
        steps_per_execution: int | None = None,
        policy: PlanningPolicy = PlanningPolicy(),
    ) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "caramel.planner.search"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        stdin = self._process.stdin
        assert stdin is not None  # stdin=PIPE
        # One line: the search starts as soon as it has read it.
        stdin.write(request(tensors, link, scheduling, policy, steps_per_execution) + "\n")
        stdin.flush()

    def done(self) -> bool:
        """Whether the search has ended (its result is then there without waiting)."""
        return self._process.poll() is not None

    def result(self) -> Plan:
        """The plan found (waits for it)."""
        output, errors = self._process.communicate()
        if self._process.returncode != 0:
            raise RuntimeError(f"the plan search failed (exit {self._process.returncode}): {errors.strip()[-2000:]}")
        return plan_from(json.loads(output))


if __name__ == "__main__":
    os.nice(19)  # the CPU the steps leave idle (see the module's docstring)
    sys.stdout.write(answer(sys.stdin.readline()))
