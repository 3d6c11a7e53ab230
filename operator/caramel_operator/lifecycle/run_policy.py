"""spec.runPolicy and the spec's validity: an invalid spec, suspend and resume, the active
deadline, and the TTL of a finished job."""

from __future__ import annotations

from datetime import datetime, timedelta

from caramel.contract.api import CaramelJobStatus, ConditionType, Phase
from caramel_operator.builders import worker_pod_problems
from caramel_operator.gang_placement import placement_problems
from caramel_operator.lifecycle.actions import Event
from caramel_operator.lifecycle.admit import delete_group
from caramel_operator.lifecycle.finish import fail
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, update_size
from caramel_operator.lifecycle.status import FINISHED, parse_timestamp, timestamp, with_condition


def reject_invalid(status: CaramelJobStatus, problems: str, now: datetime) -> Pass:
    """A spec the schema let through but Caramel cannot run: Failed, nothing created."""
    if status.phase is Phase.FAILED:
        return Pass(status, now)
    message = f"invalid spec: {problems}"
    failed = with_condition(status, ConditionType.FAILED, True, "InvalidSpec", message, now)
    failed = failed.model_copy(update={"phase": Phase.FAILED, "message": message, "completion_time": timestamp(now)})
    return Pass(failed, now, events=[Event("Warning", "InvalidSpec", message)], transitions=[Phase.FAILED])


def rejected(seen: Observed, p: Pass) -> bool:
    """Whether the spec is one Caramel cannot run, though the schema let it through: the job fails."""
    problems = (
        seen.settings.image_problems(seen.job)
        + worker_pod_problems(seen.job, default_image=seen.settings.default_image(seen.job))
        + placement_problems(seen.job)
    )
    if problems:
        # As any failure: a gang already running (the template edited since) is cleaned up.
        fail(seen, p, "InvalidSpec", f"invalid spec: {'; '.join(problems)}")
    return bool(problems)


def suspend(seen: Observed, p: Pass) -> None:
    p.delete([w for w in seen.workers if not w.terminating])
    if p.status.phase is not Phase.SUSPENDED:
        delete_group(seen, p, p.status.gang)
        p.enter(Phase.SUSPENDED)
        p.update(message="suspended: spec.runPolicy.suspend is true")
        p.condition(ConditionType.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true; pods deleted")
        p.condition(ConditionType.RUNNING, False, "Suspended")
        p.event("Normal", "Suspended", f"deleted {len(seen.workers)} worker pods; the job waits")


def resume(seen: Observed, p: Pass) -> None:
    p.enter(Phase.PENDING)
    # A new gang number: pods of the suspended gang may still be terminating. The deadline
    # starts again, as a Kubernetes Job's does: a suspended job is not running. The
    # resumed gang asks for every worker again, as a new job's does.
    p.update(gang=p.status.gang + 1, message="", start_time=timestamp(p.now))
    update_size(seen, p, next_min_workers=seen.replicas)
    p.condition(ConditionType.SUSPENDED, False, "Resumed", "spec.runPolicy.suspend is false")
    p.event("Normal", "Resumed", "creating the worker gang again")


def deadline_passed(seen: Observed, p: Pass) -> bool:
    """Whether spec.runPolicy.activeDeadlineSeconds has passed: the job fails."""
    start_time = p.status.start_time
    if not start_time:
        # The deadline counts from here, not from when every worker runs: a gang that never
        # gets there (an image that cannot be pulled, no room) must not wait forever.
        start_time = timestamp(p.now)
        p.update(start_time=start_time)
    running = (p.now - parse_timestamp(start_time)).total_seconds()
    if seen.policy.deadline_passed(running):
        deadline = seen.policy.active_deadline_seconds
        fail(seen, p, "DeadlineExceeded", f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({deadline} s)")
        return True
    return False


def expires_at(ttl: int | None, status: CaramelJobStatus) -> datetime | None:
    """When a finished job is due for deletion (ttl: spec.runPolicy.ttlSecondsAfterFinished), if ever."""
    if not isinstance(ttl, int) or ttl < 0 or status.phase not in FINISHED or not status.completion_time:
        return None
    return parse_timestamp(status.completion_time) + timedelta(seconds=ttl)
