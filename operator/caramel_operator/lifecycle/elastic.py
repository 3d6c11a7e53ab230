"""An elastic gang (rank 0 said it trains elastic) goes on without its failed workers, which are
created again to rejoin it."""

from __future__ import annotations

from caramel.contract.api import ConditionType, Phase, WorkerFailure
from caramel.contract.env import worker_name
from caramel.contract.termination import fit
from caramel_operator.lifecycle.actions import EVENT_MESSAGE_BYTES
from caramel_operator.lifecycle.failures import what_failed
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, current_gang_size, of_replicas
from caramel_operator.lifecycle.status import parse_timestamp, timestamp
from caramel_operator.observe import WorkerObservation, WorkerState


def elastic_goes_on(seen: Observed, p: Pass, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> bool:
    """Whether an elastic gang goes on without its failed workers (rank 0 said it trains
    elastic): its peers roll back to their last commit and re-form in their processes, and each
    failed worker is deleted and created again, to rejoin them at their next commit. Not where
    worker 0 failed (it serves the rendezvous), where fewer than spec.workers.minReplicas would
    remain, or where spec.runPolicy.backoffLimit is reached: those restart the whole gang."""
    status, progress = p.status, p.status.progress
    if status.phase is not Phase.RUNNING or progress is None or not progress.elastic:
        return False
    workers = current_gang_size(seen, p)
    names = {worker_name(seen.job, index): index for index in range(workers)}
    failed = [names[failure.worker] for failure in failures if failure.worker in names]
    if 0 in failed or workers - len(failed) < seen.min_workers:
        return False
    new = [failure for failure in failures if newly_failed(p, failure, current.get(names[failure.worker]))]
    replaced = status.replaced_workers + len(new)
    if new and not seen.policy.may_restart(status.restarts + replaced - 1):
        return False
    p.delete([current[index] for index in failed if index in current and not current[index].terminating])
    if new:
        limit = seen.policy.backoff_limit
        going_on = of_replicas(seen, workers - len(failed))
        message = (
            f"{what_failed(failures)}; the elastic gang goes on with {going_on} (their last commit) and "
            f"{', '.join(failure.worker for failure in new)} {'is' if len(new) == 1 else 'are'} created again to rejoin it "
            f"({status.restarts + replaced} of {limit}, spec.runPolicy.backoffLimit)"
        )
        replacing = [*status.replacing, *(f.worker for f in new if f.worker not in status.replacing)]
        p.update(replaced_workers=replaced, replacing=replacing, replaced_at=timestamp(p.now), last_failure=new[0], message=message)
        p.condition(ConditionType.RESIZED, True, "WorkerReplaced", message)
        p.event("Warning", "WorkerReplaced", fit([message], new[0].message.splitlines(), EVENT_MESSAGE_BYTES))
    return True


def newly_failed(p: Pass, failure: WorkerFailure, worker: WorkerObservation | None) -> bool:
    """Whether a failure is news: not of a worker being replaced, whose old pod goes away
    meanwhile, unless it is the replacement itself that failed (created since the decision)."""
    if failure.worker not in p.status.replacing:
        return True
    replaced_at = p.status.replaced_at
    return (
        worker is not None and worker.state is WorkerState.FAILED and bool(worker.created) and replaced_at is not None
        and parse_timestamp(worker.created) >= parse_timestamp(replaced_at)
    )  # fmt: skip


def note_rejoined(seen: Observed, p: Pass, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> None:
    """Workers of an elastic gang created again and running: no longer being replaced."""
    if not p.status.replacing:
        return
    failed = {failure.worker for failure in failures}
    running = {worker.name for worker in current.values() if worker.state is WorkerState.RUNNING and not worker.terminating}
    rejoined = [name for name in p.status.replacing if name in running and name not in failed]
    if not rejoined:
        return
    replacing = [name for name in p.status.replacing if name not in rejoined]
    p.update(replacing=replacing)
    if not replacing:
        message = f"{', '.join(rejoined)} running again; {of_replicas(seen, len(current))} in the elastic gang"
        p.condition(ConditionType.RESIZED, False, "WorkersReplaced", message)
        p.event("Normal", "WorkersReplaced", message)
