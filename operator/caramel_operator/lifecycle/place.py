"""Who places the current gang, and with R-Storm where: a placement on record, asked for
(PlaceGang), or the outcome of one the handler made recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from caramel.contract.api import GangPlacement, PlacedBy, PlacementPolicy
from caramel_operator.gang_placement import NoRoom, Outcome, Placed, Unreadable, placed_by
from caramel_operator.lifecycle.actions import PlaceGang
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, next_min_workers, update_size
from caramel_operator.lifecycle.status import parse_timestamp, timestamp
from caramel_operator.observe import WorkerObservation


def placement(seen: Observed, p: Pass, current: dict[int, WorkerObservation], sample_pod: dict[str, Any]) -> GangPlacement | None:
    """The current gang's placement; None while R-Storm is still to place it (nothing to create).
    Where the pass asked for one and the handler made it (Observed.placement), the outcome is
    recorded and the pass goes on from it: one pass places and creates the gang."""
    gang = p.status.gang
    recorded = p.status.placement if p.status.placement and p.status.placement.gang == gang else None
    if recorded and creatable(recorded):
        return recorded
    if current:
        # Part of this gang exists with no placement on record (an operator from before
        # placement made it): the rest follows it, unpinned.
        by, why = PlacedBy.SCHEDULER, ""
    else:
        by, why = placed_by(seen.job, sample_pod)
    if by is not PlacedBy.RSTORM:
        found = GangPlacement(gang=gang, by=by, message=why)
        p.update(placement=found)
        return found
    if recorded is None or recorded.retry_after is None or p.now >= parse_timestamp(recorded.retry_after):
        request = PlaceGang(sample_pod, min_workers=min_workers_to_place(seen, p, recorded), replicas=seen.replicas)
        if seen.placement is None:
            p.reads.append(request)
            return None
        record_placement(seen, p, seen.placement)
        if p.status.placement is not None and creatable(p.status.placement):
            return p.status.placement
    return None


def creatable(placement: GangPlacement) -> bool:
    """Whether the gang's pods may be created from the placement: the scheduler's (or a gang
    scheduler's), or R-Storm's that found nodes for them."""
    return placement.by is not PlacedBy.RSTORM or bool(placement.workers)


def min_workers_to_place(seen: Observed, p: Pass, recorded: GangPlacement | None) -> int:
    """`next_min_workers`, or spec.workers.minReplicas once R-Storm has found no room for the gang
    for the gang scheduling timeout."""
    timeout = seen.settings.gang_scheduling_timeout_seconds
    waited = recorded is not None and recorded.waiting_since is not None and (
        p.now - parse_timestamp(recorded.waiting_since)
    ).total_seconds() >= timeout
    at_least = next_min_workers(seen, p)
    if not waited or seen.min_workers >= at_least:
        return at_least
    update_size(seen, p, reason=f"the whole gang did not fit within the gang scheduling timeout ({timeout:.0f} s)")
    return seen.min_workers


def record_placement(seen: Observed, p: Pass, outcome: Outcome) -> Pass:
    """The outcome of R-Storm's placement of the current gang, in the status (and Events).

    A placement found is recorded for the pass to create the pods from; nodes given more CPU
    than they have free are named, since their workers wait for CPU. When no placement fits,
    or RStorm was asked for but the operator may not read the nodes, nothing is created: the
    reason goes into status.message and a Warning Event, and placement is tried again after the
    restart backoff (10 s, 20 s, ...). Auto, where the nodes cannot be read (namespaced RBAC),
    leaves the gang to the scheduler.
    """
    status = p.status
    if isinstance(outcome, Placed):
        placement = GangPlacement(gang=status.gang, by=PlacedBy.RSTORM, workers=list(outcome.workers), cpu_short=list(outcome.cpu_short))
        nodes = {worker.node for worker in outcome.workers}
        racks = {worker.rack for worker in outcome.workers}
        p.event("Normal", "Placed", f"R-Storm placed {len(outcome.workers)} workers on {len(nodes)} nodes in {len(racks)} racks (status.placement)")
        message = ""
        if outcome.cpu_short:
            message = (
                f"placed with too little free CPU on {', '.join(outcome.cpu_short)} (CPU is a soft constraint of "
                "R-Storm): the workers there wait until CPU frees up"
            )
            p.event("Warning", "PlacedCpuShort", message)
        p.update(placement=placement, message=message)
        return p
    if isinstance(outcome, Unreadable) and seen.job.spec.placement.policy is PlacementPolicy.AUTO:
        message = f"R-Storm cannot read the cluster ({outcome.message}): the scheduler places the gang"
        p.event("Warning", "PlacementUnavailable", message)
        p.update(placement=GangPlacement(gang=status.gang, by=PlacedBy.SCHEDULER, message=message))
        return p
    previous = status.placement if status.placement and status.placement.gang == status.gang else None
    attempts = (previous.attempts if previous else 0) + 1
    waiting_since = previous.waiting_since if previous and previous.waiting_since else timestamp(p.now)
    backoff = seen.policy.backoff(attempts - 1)
    if isinstance(outcome, NoRoom):
        why = outcome.message
    else:
        why = f"R-Storm placement (spec.placement.policy RStorm) needs to list nodes and pods cluster-wide: {outcome.message}"
    message = f"cannot place the gang: {why}; trying again in {backoff:.0f} s"
    p.update(
        placement=GangPlacement(
            gang=status.gang,
            by=PlacedBy.RSTORM,
            attempts=attempts,
            retry_after=timestamp(p.now + timedelta(seconds=backoff)),
            waiting_since=waiting_since,
        ),
        message=message,
    )
    p.event("Warning", "Unplaceable", message)
    return p
