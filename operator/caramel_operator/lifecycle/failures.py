"""The current gang's failed workers, the first to fail first, and how to tell of them."""

from __future__ import annotations

from datetime import UTC, datetime

from caramel.contract.api import Phase, WorkerFailure
from caramel.contract.env import worker_name
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, current_gang_size
from caramel_operator.observe import POD_DELETED, WorkerObservation, WorkerState

# Sorts failures whose time is not known (which come first anyway) beside those whose time is.
NO_TIME = datetime.min.replace(tzinfo=UTC)


def failures(seen: Observed, p: Pass, current: dict[int, WorkerObservation]) -> list[WorkerFailure]:
    """The current gang's failed workers, the first to fail first (`WorkerObservation.failed_at`):
    the peers of a worker that fails follow it within moments, each with its own error (a
    connection reset, a collective aborted), and the first is the cause. Workers gone with no
    time to tell (a pod deleted and gone, a lost node) come before the rest, since no peer's
    failure takes a pod away; ties go by index."""
    found: list[tuple[datetime | None, int, WorkerFailure]] = []
    for index in range(current_gang_size(seen, p)):
        worker = current.get(index)
        if worker is None:
            # Gone after the gang ran: deleted by someone, or garbage-collected with its node.
            if p.status.phase is Phase.RUNNING:
                found.append((None, index, WorkerFailure(worker=worker_name(seen.job, index), reason=POD_DELETED)))
        elif worker.state is WorkerState.FAILED:
            failure = WorkerFailure(
                worker=worker.name,
                reason=worker.failure_reason,
                exit_code=worker.exit_code,
                cause=worker.failure_cause,
                message=worker.failure_message,
            )
            found.append((worker.failed_at, index, failure))
        elif worker.terminating:
            failure = WorkerFailure(worker=worker.name, reason=POD_DELETED, message="deleted while the job was running")
            found.append((worker.failed_at, index, failure))
    found.sort(key=lambda item: (item[0] is not None, item[0] or NO_TIME, item[1]))
    return [failure for _, _, failure in found]


def how_it_ended(failure: WorkerFailure) -> str:
    """A failed worker's reason, with its exit code where it exited: "Error, exit code 137"."""
    return failure.reason if failure.exit_code is None else f"{failure.reason}, exit code {failure.exit_code}"


def what_failed(failures: list[WorkerFailure]) -> str:
    """The first failure, its cause, and who followed it."""
    failure, followers = failures[0], failures[1:]
    what = f"worker {failure.worker} failed: {how_it_ended(failure)}"
    if failure.cause:
        what += f": {failure.cause}"
    if followers:
        who = ", ".join(f"{follower.worker} ({how_it_ended(follower)})" for follower in followers)
        what += f"; {who} failed after it"
    return what
