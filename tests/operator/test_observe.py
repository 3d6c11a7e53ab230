"""What the operator reads of a worker pod: here, when a failed or deleted worker went, by which
the lifecycle blames the first of several failed workers."""

from __future__ import annotations

from datetime import UTC, datetime

from caramel.contract.termination import failure_message
from caramel_operator.builders import build_worker_pod
from caramel.contract.jobfile import parse_job
from caramel_operator.observe import WorkerState, observe_pod

FAILED_AT = datetime(2026, 11, 21, 12, 0, 7, 250000, tzinfo=UTC)
POD = build_worker_pod(
    parse_job({"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo"}, "spec": {"script": "t.py"}}),
    1,
    default_image="x",
)


def failed_pod(message: str = "", finished_at: str | None = "2026-11-21T12:00:09Z", **metadata) -> dict:
    terminated = {"exitCode": 137, "reason": "Error", "message": message} | ({"finishedAt": finished_at} if finished_at else {})
    container = {"name": "worker", "state": {"terminated": terminated}}
    return {**POD, "metadata": {**POD["metadata"], **metadata}, "status": {"phase": "Failed", "containerStatuses": [container]}}


def test_a_failed_worker_went_when_its_summary_says_its_rank_failed():
    """The kubelet's finishedAt is to the second, and later: the worker stopped its other ranks first."""
    message = failure_message("rank 1 killed by SIGKILL", FAILED_AT, [], ["rank 1 | step 700"])
    seen = observe_pod(failed_pod(message))
    assert seen.state is WorkerState.FAILED and seen.failed_at == FAILED_AT
    assert seen.failure_cause == "rank 1 killed by SIGKILL"


def test_without_a_summary_the_container_says_when_it_finished():
    assert observe_pod(failed_pod("Traceback (most recent call last):")).failed_at == datetime(2026, 11, 21, 12, 0, 9, tzinfo=UTC)
    assert observe_pod(failed_pod(finished_at=None)).failed_at is None


def test_a_deleted_worker_went_when_its_deletion_was_asked_for():
    """deletionTimestamp is the request plus the grace period; a pod deleted went then, though its
    worker failed only on being stopped."""
    deleted = {"deletionTimestamp": "2026-11-21T12:00:35Z", "deletionGracePeriodSeconds": 30}
    assert observe_pod(failed_pod(**deleted)).failed_at == datetime(2026, 11, 21, 12, 0, 5, tzinfo=UTC)
    running = {**POD, "metadata": {**POD["metadata"], **deleted}, "status": {"phase": "Running"}}
    seen = observe_pod(running)
    assert seen.terminating and seen.failed_at == datetime(2026, 11, 21, 12, 0, 5, tzinfo=UTC)
    assert observe_pod({**POD, "status": {"phase": "Running"}}).failed_at is None


def test_a_worker_stopped_by_its_pods_deletion_is_lost_whatever_it_exited_with():
    """Deleted, its worker exits 143 on SIGTERM and the pod turns Failed before it goes: that is
    a deletion (no backoff), not a crash (a backoff), however late the operator looks."""
    deleted = {"deletionTimestamp": "2026-11-21T12:00:38Z", "deletionGracePeriodSeconds": 30}  # asked at 12:00:08
    stopped = observe_pod(failed_pod(**deleted))  # finished at 12:00:09, and wrote no summary
    assert (stopped.state, stopped.failure_reason, stopped.exit_code) == (WorkerState.FAILED, "PodDeleted", 137)
    # One whose rank failed of itself before the deletion (its summary says when) keeps its reason.
    message = failure_message("rank 1 exited with code 1", FAILED_AT, [], [])
    assert observe_pod(failed_pod(message, **deleted)).failure_reason == "Error"
