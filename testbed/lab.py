"""Laboratory settings: the planning policy (`caramel.planner.policy`) a benchmark or test runs a
job's training with, instead of Caramel's own.

The driver of a run sets them, as JSON in CARAMEL_LAB_SCHEDULING (`lab_variables`), in the job's
environment; the benchmarks' and tests' training scripts (benchmarks/joining.py,
testbed/sgd_worker.py, testbed/overlap_graph_worker.py) read them (`lab_policy`) and give them to
the runtime before they join the job's ranks (`caramel.tensorflow.runtime.plan_with`). Any other
training script ignores them: no job chooses a policy. They live in the test bed, which the
benchmarks import, as the tests' workers run them too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pydantic import ValidationError

from caramel.planner.policy import POLICY, PlanningPolicy

LAB_SCHEDULING = "CARAMEL_LAB_SCHEDULING"
SETTINGS = tuple(field.name for field in fields(PlanningPolicy))


def lab_variables(**settings: Any) -> dict[str, str]:
    """The environment of a job's training processes that sets these settings (`PlanningPolicy`'s
    fields, by name and value: ordering="arrival")."""
    return {LAB_SCHEDULING: json.dumps(POLICY.dump_python(parsed(settings), mode="json"))}


def lab_policy(environ: Mapping[str, str] = os.environ) -> PlanningPolicy:
    """The policy CARAMEL_LAB_SCHEDULING sets (unset or empty: Caramel's own)."""
    text = environ.get(LAB_SCHEDULING)
    if not text:
        return PlanningPolicy()
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise RuntimeError(f"{LAB_SCHEDULING}: not JSON ({error})") from None
    if not isinstance(settings, dict):
        raise RuntimeError(f"{LAB_SCHEDULING}: a JSON object of settings ({', '.join(SETTINGS)}), not {text}")
    return parsed(settings)


def parsed(settings: Mapping[str, Any]) -> PlanningPolicy:
    """The policy of these settings; an unknown one, or a bad value, is named."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise RuntimeError(f"{LAB_SCHEDULING}: {', '.join(unknown)}: not a setting ({', '.join(SETTINGS)})")
    try:
        return POLICY.validate_python(settings)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors())
        raise RuntimeError(f"{LAB_SCHEDULING}: {problems}") from None
