"""How a job fails, and what becomes of a finished job's pods (spec.runPolicy.cleanPodPolicy)."""

from __future__ import annotations

from caramel.contract.api import CleanPodPolicy, ConditionType, Phase
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass
from caramel_operator.lifecycle.status import timestamp
from caramel_operator.observe import WorkerState


def fail(seen: Observed, p: Pass, reason: str, message: str) -> None:
    p.enter(Phase.FAILED)
    p.update(completion_time=timestamp(p.now), message=message)
    p.condition(ConditionType.FAILED, True, reason, message)
    p.condition(ConditionType.RUNNING, False, reason)
    p.condition(ConditionType.RESTARTING, False, reason)
    p.event("Warning", reason, message)
    clean_up_pods(seen, p)


def clean_up_pods(seen: Observed, p: Pass) -> None:
    """Apply spec.runPolicy.cleanPodPolicy to a finished job's pods."""
    policy = seen.job.spec.run_policy.clean_pod_policy
    if policy is CleanPodPolicy.NONE:
        return
    finished = {WorkerState.SUCCEEDED, WorkerState.FAILED}
    p.delete([w for w in seen.workers if not w.terminating and (policy is CleanPodPolicy.ALL or w.state not in finished)])
