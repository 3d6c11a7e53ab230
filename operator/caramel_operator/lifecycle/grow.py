"""A gang R-Storm placed short of spec.workers.replicas looks for room for more while it runs,
and, room found, restarts with them after rank 0's next checkpoint (a resize)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from caramel.contract.api import Phase, PlacedBy
from caramel_operator.gang_placement import Outcome, Placed
from caramel_operator.lifecycle.actions import PlaceGang
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, update_size
from caramel_operator.lifecycle.restart import restart
from caramel_operator.lifecycle.status import parse_timestamp, timestamp
from caramel_operator.observe import WorkerObservation, WorkerState


def grow_at_checkpoint(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> bool:
    """A gang that found room to grow restarts once rank 0 has written a checkpoint since:
    the new gang resumes from it, losing the few steps run after it. Not a gang whose workers
    are finishing: its last checkpoint is its end."""
    size, progress = p.status.size, p.status.progress
    if p.status.phase is not Phase.RUNNING or size is None or not size.grow_to or progress is None:
        return False
    if any(worker.state is not WorkerState.RUNNING for worker in current.values()):
        return False
    step = progress.checkpoint_step or 0
    if step <= size.grow_after_step:
        return False
    what = f"room for {size.grow_to} of {seen.replicas} workers, and a checkpoint at step {step}"
    restart(seen, p, f"{what}: the gang of {size.workers} grows", "GangResized", next_min_workers=size.workers)
    return True


def look_for_room(seen: Observed, p: Pass, sample_pod: dict[str, Any]) -> None:
    """While a gang R-Storm placed runs short of spec.workers.replicas, look for room for more
    every gang scheduling timeout (PlaceGang.growing; what the handler found: `record_room`). It
    can grow only at a checkpoint, which the operator learns of from rank 0's metrics: jobs
    without spec.checkpoint or metrics grow at restarts only."""
    status = p.status
    size, placement = status.size, status.placement
    if (
        status.phase is not Phase.RUNNING
        or size is None
        or size.gang != status.gang
        or size.workers >= seen.replicas
        or size.grow_to
        or size.next_look is None
        or p.now < parse_timestamp(size.next_look)
        or not (seen.job.spec.checkpoint and seen.job.spec.metrics.enabled)
        or placement is None
        or placement.gang != status.gang
        or placement.by is not PlacedBy.RSTORM
    ):
        return
    update_size(seen, p, next_look=timestamp(p.now + timedelta(seconds=seen.settings.gang_scheduling_timeout_seconds)))
    if seen.placement is None:
        p.reads.append(PlaceGang(sample_pod, min_workers=size.workers + 1, replicas=seen.replicas, growing=True))
    else:
        record_room(seen, p, seen.placement)


def record_room(seen: Observed, p: Pass, outcome: Outcome) -> Pass:
    """Room found for more workers of a gang that runs short: it restarts with them after rank 0's
    next checkpoint (`grow_at_checkpoint`). No room, or no right to look: the gang runs on as it
    is, quietly, and looks again later. Nor is room short of CPU room to grow into: the new
    workers would wait for it, and the gang would shrink again after the timeout."""
    size = p.status.size
    if not isinstance(outcome, Placed) or outcome.cpu_short or size is None:
        return p
    progress = p.status.progress
    grow_to = len(outcome.workers)
    p.event(
        "Normal",
        "RoomToGrow",
        f"room for {grow_to} of {seen.replicas} workers: the gang of {size.workers} restarts with them after its next checkpoint",
    )
    after = (progress.checkpoint_step or 0) if progress else 0
    p.update(size=size.model_copy(update={"grow_to": grow_to, "grow_after_step": after}))
    return p
