"""`decide`: one pass of the lifecycle, its steps run in order into one Pass; and `due`, when
the status asks for the next pass itself."""

from __future__ import annotations

from datetime import datetime

from caramel.contract.api import CaramelJobStatus, Phase
from caramel_operator.lifecycle.advance import advance, count_workers
from caramel_operator.lifecycle.create import create_gang, create_own_objects
from caramel_operator.lifecycle.finish import clean_up_pods
from caramel_operator.lifecycle.grow import grow_at_checkpoint, look_for_room
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, gang_size
from caramel_operator.lifecycle.progress import follow_progress
from caramel_operator.lifecycle.restart import gang_stuck, image_invalid, worker_failed
from caramel_operator.lifecycle.run_policy import deadline_passed, rejected, resume, suspend
from caramel_operator.lifecycle.status import FINISHED, parse_timestamp


def decide(seen: Observed) -> Pass:
    """The pass over the job that `seen` observes: the new status, the actions that move the
    cluster towards it, and what the handler is to read (Pass.reads) and give a second call,
    which then decides from it. Pure and deterministic: the same observation, the same pass."""
    p = Pass(seen.status, seen.now)
    if p.status.phase in FINISHED:
        clean_up_pods(seen, p)
    elif not rejected(seen, p):
        if seen.job.spec.run_policy.suspend:
            suspend(seen, p)
        else:
            run(seen, p)
    count_workers(seen, p)
    follow_progress(seen, p)
    return p


def run(seen: Observed, p: Pass) -> None:
    """The steps of a job that is neither finished nor suspended."""
    if p.status.phase is Phase.SUSPENDED:
        resume(seen, p)
    if deadline_passed(seen, p):
        return
    create_own_objects(seen, p)
    stale = [w for w in seen.workers if w.gang != p.status.gang]
    p.delete([w for w in stale if not w.terminating])
    current = {w.index: w for w in seen.workers if w.gang == p.status.gang}
    restart_after = p.status.restart_after  # set with the phase (restart)
    if p.status.phase is Phase.RESTARTING and (stale or (restart_after and p.now < parse_timestamp(restart_after))):
        return  # the backoff runs, or the failed gang is still going away
    if image_invalid(seen, p, current) or worker_failed(seen, p, current) or gang_stuck(seen, p, current):
        return
    # Worker 0's pod of the current gang, built once: its requests, tolerations and node
    # selection are what placement weighs and what a gang scheduler's group asks for.
    sample_pod = seen.worker_pod(0, gang=p.status.gang)
    size = gang_size(p)
    if size is None or len(current) < size:
        if stale:  # stale pods hold the names the new ones need
            return
        create_gang(seen, p, current, sample_pod)
        size = gang_size(p)
        if size is None or len(current) < size:
            return  # else every pod was there, the gang unsized (by an operator from before sizes)
    if grow_at_checkpoint(seen, p, current):
        return
    advance(seen, p, current)
    look_for_room(seen, p, sample_pod)


def due(status: CaramelJobStatus, now: datetime) -> datetime | None:
    """When the status asks for a pass itself, after `now`: at the end of a restart's backoff, or
    of the wait before R-Storm tries to place the gang again. None while only the pods' changes
    (the old gang's going, say) and the reconcile interval call for passes."""
    placement = status.placement if status.placement and status.placement.gang == status.gang else None
    waits = [
        status.restart_after if status.phase is Phase.RESTARTING else None,
        placement.retry_after if placement else None,
    ]
    return min((end for end in (parse_timestamp(wait) for wait in waits if wait) if end > now), default=None)
