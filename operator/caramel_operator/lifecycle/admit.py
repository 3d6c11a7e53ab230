"""Admission by a gang scheduler that takes a group object (a Volcano PodGroup): the group
created, read and deleted with its gang, and the gang's pods held back until it is admitted."""

from __future__ import annotations

from typing import Any

from caramel_operator.gang_schedulers import group_name
from caramel_operator.lifecycle.actions import CreateGroup, DeleteGroup, ReadGroup
from caramel_operator.lifecycle.finish import fail
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass

# status.pendingReason (and the Event's reason) of a gang whose gang scheduler has yet to admit it.
WAITING_FOR_ADMISSION = "WaitingForAdmission"


def gang_admitted(seen: Observed, p: Pass, size: int, sample_pod: dict[str, Any]) -> bool:
    """Whether the gang scheduler admitted the new gang of `size` workers, so that its pods may
    be created. A scheduler that takes a group object gets it first (owned by the job) and the
    pods wait until the group is admitted; a cluster that does not serve the group's resource
    fails the job, naming what to install. The group is read where the pass asks (ReadGroup):
    only a gang whose pods are yet to be created waits on it. Pods of a gang already created
    belong to an admitted gang: its missing ones are created without asking again."""
    resource = seen.scheduler.resource
    if resource is None:
        return True
    gang = p.status.gang
    group = seen.scheduler.group(seen.job, gang, size, sample_pod)
    if group is None:
        return True
    seen_group = seen.group if seen.group is not None and seen.group.gang == gang else None
    if seen_group is None:
        p.reads.append(ReadGroup(resource, group["metadata"]["name"], gang))
        return False
    scheduler = seen.scheduler.name
    what = f"{resource.kind} {group['metadata']['name']}"
    if not seen_group.served:
        fail(
            seen,
            p,
            "GangSchedulerMissing",
            f"spec.runPolicy.schedulingPolicy.gangScheduler {scheduler}: the API server does not serve {resource}; "
            f"install {seen.scheduler.installed}, or choose another gang scheduler",
        )
        return False
    if seen_group.found is None:
        # Said nothing of yet: a refusal of the creation is what the status says (FailedCreate).
        p.actions.append(CreateGroup(resource, group))
        return False
    if not seen.scheduler.admitted(seen_group.found):
        phase = (seen_group.found.get("status") or {}).get("phase")
        message = f"waiting for {scheduler} to admit {what}, a gang of {size} workers" + (f" (phase {phase})" if phase else "")
        if p.status.pending_reason != WAITING_FOR_ADMISSION:  # an Event once, not at every change of phase
            p.event("Normal", WAITING_FOR_ADMISSION, message)
        p.update(message=message, pending_reason=WAITING_FOR_ADMISSION)
        return False
    return True


def delete_group(seen: Observed, p: Pass, gang: int) -> None:
    """Delete the group object of a gang that goes (restarted, suspended); a finished job's
    stays with it, as its pods may, and goes with it (owner reference)."""
    if seen.scheduler.resource is not None:
        p.actions.append(DeleteGroup(seen.scheduler.resource, group_name(seen.job, gang)))
