"""A gang that cannot go on restarts whole, after a backoff where a worker failed of itself, or
the job fails: a worker failed, an image no runtime accepts, a gang stuck partly scheduled."""

from __future__ import annotations

import math
from datetime import timedelta

from caramel.contract.api import ConditionType, Phase, PlacedBy, WorkerFailure
from caramel.contract.restart import NOT_RESTARTED, SCRIPT_ERROR
from caramel.contract.termination import fit, script_raised
from caramel_operator.lifecycle.actions import EVENT_MESSAGE_BYTES
from caramel_operator.lifecycle.admit import delete_group
from caramel_operator.lifecycle.elastic import elastic_goes_on, note_rejoined
from caramel_operator.lifecycle.failures import failures as failures_of, what_failed
from caramel_operator.lifecycle.finish import fail
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, current_gang_size, size_on_record, update_size
from caramel_operator.lifecycle.status import parse_timestamp, timestamp
from caramel_operator.observe import INVALID_IMAGE, LOST_REASONS, WorkerObservation, WorkerState


def image_invalid(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> bool:
    """An image name no runtime accepts: no restart can help, so the job fails at once."""
    worker = next((w for w in current.values() if w.pending_reason == INVALID_IMAGE), None)
    if worker is None:
        return False
    p.update(last_failure=WorkerFailure(worker=worker.name, reason=INVALID_IMAGE, message=worker.pending_message))
    fail(seen, p, INVALID_IMAGE, f"{worker.name} cannot start: {worker.pending_message} (check spec.image)")
    return True


def gang_stuck(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> bool:
    """Part of the gang holds its nodes while the rest cannot be scheduled: after the timeout,
    the gang restarts with the scheduled part where spec.workers.minReplicas allows it (a
    resize), or else releases it all, so that the held resources can serve the gang as a
    whole later (or another job), and retries with backoff. A gang scheduler's admission
    (spec.runPolicy.schedulingPolicy: Kueue, Volcano) avoids this."""
    if len(current) < current_gang_size(seen, p) or p.status.phase is Phase.RUNNING:
        return False
    unschedulable = [w for w in current.values() if w.pending_reason == "Unschedulable"]
    holding = [w for w in current.values() if w.scheduled]
    created = [parse_timestamp(w.created) for w in current.values() if w.created]
    if not unschedulable or not holding or not created:
        return False
    waited = (p.now - min(created)).total_seconds()
    timeout = seen.settings.gang_scheduling_timeout_seconds
    if waited < timeout:
        return False
    what = (
        f"{len(unschedulable)} of {len(current)} workers unschedulable for {waited:.0f} s "
        f"while {len(holding)} held their nodes (gang scheduling timeout {timeout:.0f} s)"
    )
    if len(holding) >= seen.min_workers:
        why = f"{len(unschedulable)} stayed unschedulable for the gang scheduling timeout ({timeout:.0f} s)"
        restart(
            seen, p, f"{what}: the gang runs with the {len(holding)} scheduled", "GangResized", next_min_workers=len(holding), why=why
        )
        return True
    worker = min(unschedulable, key=lambda w: w.index)
    failure = WorkerFailure(worker=worker.name, reason="GangUnschedulable", message=worker.pending_message)
    released = f"released the partly scheduled gang: {what}"
    restart(seen, p, released, "GangUnschedulable", failure=failure, next_min_workers=current_gang_size(seen, p))
    return True


def worker_failed(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> bool:
    """Whether a worker of the current gang failed, so that the gang restarts (or the job fails);
    an elastic gang may go on without it (elastic.py)."""
    failures = failures_of(seen, p, current)
    note_rejoined(seen, p, current, failures)
    if not failures:
        return False
    if script_error(seen, p, current, failures):
        return True
    if elastic_goes_on(seen, p, current, failures):
        return False
    what = what_failed(failures)
    failure = failures[0]
    lost = [f for f in failures if f.reason in LOST_REASONS]
    if lost:
        # Their room went with them: the survivors fit, and R-Storm places more where they do.
        names = ", ".join(f"{f.worker} ({f.reason})" for f in lost)
        why = f"{names} {'was' if len(lost) == 1 else 'were'} lost"  # e.g. demo-worker-3 (NodeLost) was lost
        restart(seen, p, what, "WorkerFailed", failure=failure, next_min_workers=current_gang_size(seen, p) - len(lost), why=why)
        return True
    # The gang before fit. R-Storm sees whether more do now; the scheduler is asked for the
    # whole gang again, and the gang scheduling timeout shrinks it if that does not fit.
    placement = p.status.placement
    placed_by_rstorm = placement is not None and placement.gang == p.status.gang and placement.by is PlacedBy.RSTORM
    at_least = current_gang_size(seen, p) if placed_by_rstorm else seen.replicas
    restart(seen, p, what, "WorkerFailed", failure=failure, next_min_workers=at_least)
    return True


def script_error(seen: Observed, p: Pass, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> bool:
    """Whether the gang's script raised before rank 0's first step, as every failed worker
    says: the job fails at once. Or whether that may be so, and worker 0, which alone can tell
    whether rank 0 did a step, still runs: no restart for a while yet (the pass that its pod's
    change calls, or the reconcile interval's, looks again). A lost worker is no script's error."""
    raised = [None if failure.reason in LOST_REASONS else script_raised(failure.message) for failure in failures]
    if seen.policy.fails_at_once(raised):
        p.update(last_failure=failures[0])
        fail(seen, p, SCRIPT_ERROR, f"{what_failed(failures)}; {NOT_RESTARTED}")
        return True
    worker_0 = current.get(0)
    worker_0_runs = worker_0 is not None and worker_0.state is WorkerState.RUNNING and not worker_0.terminating
    first_failed = min((w.failed_at for w in current.values() if w.state is WorkerState.FAILED and w.failed_at), default=None)
    since = math.inf if first_failed is None else (p.now - first_failed).total_seconds()
    return seen.policy.awaits_rank_0(raised, worker_0_runs, since)


def restart(
    seen: Observed,
    p: Pass,
    what: str,
    reason: str,
    *,
    next_min_workers: int,
    failure: WorkerFailure | None = None,
    why: str | None = None,
) -> None:
    """Delete the whole gang and start a new one of at least `next_min_workers` (never fewer than
    spec.workers.minReplicas); `why`, where given, is why it may have fewer than replicas.

    After a failure the restart counts against backoffLimit (or the job fails there) and
    waits the backoff, unless the worker blamed was lost (LOST_REASONS). A resize (no
    failure) does neither: nothing failed, the gang's size changes, and the new gang resumes
    from the latest checkpoint at once."""
    current = [w for w in seen.workers if w.gang == p.status.gang]
    shrinking = next_min_workers < current_gang_size(seen, p)
    limit = seen.policy.backoff_limit
    restarts, waited, backoff = p.status.restarts, p.status.backed_off_restarts, 0.0
    if failure is not None:
        p.update(last_failure=failure)
        if not seen.policy.may_restart(restarts + p.status.replaced_workers):
            fail(seen, p, "BackoffLimitExceeded", f"{what}; spec.runPolicy.backoffLimit ({limit}) reached")
            return
        restarts += 1
        if failure.reason not in LOST_REASONS:  # a crash may well crash again; a lost worker is no crash loop
            backoff = seen.policy.backoff(waited)
            waited += 1
    p.enter(Phase.RESTARTING)
    delete_group(seen, p, p.status.gang)
    p.update(
        restarts=restarts,
        backed_off_restarts=waited,
        gang=p.status.gang + 1,
        restart_after=timestamp(p.now + timedelta(seconds=backoff)),
        replacing=[],  # the new gang starts whole
    )
    reason_for_size = size_on_record(seen, p).reason if why is None else why
    update_size(seen, p, next_min_workers=max(seen.min_workers, next_min_workers), reason=reason_for_size)
    if failure is not None:
        when = f"in {backoff:.0f} s" if backoff else "at once"
        message = f"{what}; restarting the whole gang ({restarts + p.status.replaced_workers} of {limit}) {when}"
    else:
        message = f"{what}; restarting the whole gang from its latest checkpoint"
    p.update(message=message)
    p.condition(ConditionType.RESTARTING, True, reason, message)
    p.condition(ConditionType.RUNNING, False, reason, what)
    if failure is not None:
        # The failed pod goes with its gang: its last lines stay in the Event (the status keeps
        # only the last failure's).
        p.event("Warning", reason, fit([message], failure.message.splitlines(), EVENT_MESSAGE_BYTES))
    else:
        p.event("Warning" if shrinking else "Normal", reason, message)
    p.delete([w for w in current if not w.terminating])
