"""A created gang's phase from its workers' states: Pending (and why), Running, Succeeded; and
the workers counted in the status."""

from __future__ import annotations

from caramel.contract.api import ConditionType, Phase, TrainingProgress, WorkerCounts
from caramel_operator.lifecycle.finish import clean_up_pods
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, of_replicas
from caramel_operator.lifecycle.status import FINISHED, timestamp
from caramel_operator.observe import WorkerObservation, WorkerState


def advance(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> None:
    states = [worker.state for worker in current.values()]
    if all(state is WorkerState.SUCCEEDED for state in states):
        succeed(seen, p, current.get(0))
    elif all(state in (WorkerState.RUNNING, WorkerState.SUCCEEDED) for state in states):
        if p.status.phase is not Phase.RUNNING:
            p.enter(Phase.RUNNING)
            p.update(message="")
            running = of_replicas(seen, len(current))
            p.condition(ConditionType.RUNNING, True, "AllWorkersRunning", f"{running} running")
            p.condition(ConditionType.RESTARTING, False, "AllWorkersRunning")
            p.event("Normal", "Running", f"{running} running")
    else:
        explain_pending(p, current)


def succeed(seen: Observed, p: Pass, rank0_worker: WorkerObservation | None) -> None:
    p.enter(Phase.SUCCEEDED)
    p.update(completion_time=timestamp(p.now), message="")
    final_progress(p, rank0_worker)
    p.condition(ConditionType.SUCCEEDED, True, "AllWorkersSucceeded", "every worker finished")
    p.condition(ConditionType.RUNNING, False, "AllWorkersSucceeded")
    p.condition(ConditionType.RESTARTING, False, "AllWorkersSucceeded")
    p.event("Normal", "Succeeded", "every worker finished")
    clean_up_pods(seen, p)


def final_progress(p: Pass, rank0_worker: WorkerObservation | None) -> None:
    """The last scrape may predate the last steps: the final report in worker 0's termination
    message has the step the job ended at."""
    report = rank0_worker.final_report if rank0_worker else None
    if report is None:
        return
    progress = p.status.progress or TrainingProgress()
    final = {"step": report.step, "update_time": timestamp(p.now)}
    if report.timed:  # else the run resumed at its last step: the last scrape's figures stand
        final |= {"step_seconds": round(report.step_seconds, 6), "loss": report.loss}
    p.update(progress=progress.model_copy(update=final))


def explain_pending(p: Pass, current: dict[int, WorkerObservation]) -> None:
    """Say why the gang waits: the first worker with a known cause, in the status, and in an
    Event when the reason changes (not when only its detail does: the kubelet flips between
    ErrImagePull and ImagePullBackOff for as long as an image cannot be pulled)."""
    blocked = [w for w in current.values() if w.state is WorkerState.PENDING and w.pending_reason]
    if not blocked:
        p.update(pending_reason="")
        return
    worker = min(blocked, key=lambda w: w.index)
    others = f" (and {len(blocked) - 1} more workers)" if len(blocked) > 1 else ""
    message = f"{worker.name} is pending{others}: {worker.pending_reason}: {worker.pending_message}"
    if worker.pending_reason != p.status.pending_reason:
        p.event("Warning", worker.pending_reason, message)
    p.update(message=message, pending_reason=worker.pending_reason)


def count_workers(seen: Observed, p: Pass) -> None:
    current = [w for w in seen.workers if w.gang == p.status.gang and not w.terminating]
    if p.status.phase in FINISHED:
        # Its pending and running pods are being deleted, or with cleanPodPolicy None left to
        # run out: none of them works for the job any more.
        current = [w for w in current if w.state in (WorkerState.SUCCEEDED, WorkerState.FAILED)]
    counts = WorkerCounts(
        total=seen.replicas,
        pending=sum(w.state is WorkerState.PENDING for w in current),
        running=sum(w.state is WorkerState.RUNNING for w in current),
        succeeded=sum(w.state is WorkerState.SUCCEEDED for w in current),
        failed=sum(w.state is WorkerState.FAILED for w in current),
    )
    p.update(workers=counts, ready_workers=f"{counts.running}/{seen.replicas}")
