"""What a worker pod says about itself, reduced to what the gang lifecycle needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from caramel.contract.progress import ProgressReport
from caramel.contract import termination
from caramel_operator.builders import GANG_LABEL, JOB_LABEL, WORKER_CONTAINER, WORKER_INDEX_LABEL

# Container waiting reasons that mean the image cannot be had (yet: a registry may come back, a
# secret may be added).
IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff"}
# Waiting reasons no retry can cure: the kubelet never tries again.
PERMANENT_IMAGE_REASONS = {"InvalidImageName", "ErrImageNeverPull"}
INVALID_IMAGE = "InvalidImage"
# Pod status reasons that mean the pod's node is gone or the pod was pushed off it.
NODE_LOST_REASONS = {"NodeLost", "Evicted", "Terminated", "NodeShutdown"}
# A worker whose pod was deleted while it ran: by someone's `kubectl delete`, a drain (the
# Eviction API), a preemption, the taint manager, or the garbage collector of a gone node's pods.
POD_DELETED = "PodDeleted"
# Why a worker is lost rather than failed: it was taken away, its training did not fail. Its
# node is gone, or it was pushed off it, or its pod deleted while it ran (whatever its container
# exited with on being stopped). A lost worker takes its room with it, and is no crash loop.
LOST_REASONS = NODE_LOST_REASONS | {POD_DELETED}


class WorkerState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class WorkerObservation:
    """One worker pod as last seen."""

    name: str
    job: str
    index: int
    gang: int
    state: WorkerState
    terminating: bool = False
    pod_ip: str | None = None
    failure_reason: str = ""
    exit_code: int | None = None
    failure_cause: str = ""
    """The first line of the failure message that reads as an error."""
    failure_message: str = ""
    """The container's termination message (the worker's failure summary, or the kubelet's tail of
    its log), or the pod's status message."""
    pending_reason: str = ""
    pending_message: str = ""
    scheduled: bool = False
    """Bound to a node: it holds that node's resources."""
    created: str = ""
    """The pod's creation time (RFC 3339)."""
    final_report: ProgressReport | None = None
    """The last progress report of a worker that succeeded (rank 0's, from worker 0's termination message)."""
    failed_at: datetime | None = None
    """When a failed or deleted worker went, as closely as its pod tells: its own record of when its
    rank failed (to the microsecond), else its container's finishedAt (to the second); for a pod
    being deleted, when the deletion was asked for, if earlier. None where nothing tells."""


def observe_pod(pod: dict[str, Any]) -> WorkerObservation | None:
    """The observation of a Caramel worker pod, or None for any other pod."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    if JOB_LABEL not in labels or WORKER_INDEX_LABEL not in labels:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    container: dict[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == WORKER_CONTAINER), {}
    )
    base: dict[str, Any] = dict(
        name=metadata["name"],
        job=labels[JOB_LABEL],
        index=int(labels[WORKER_INDEX_LABEL]),
        gang=int(labels.get(GANG_LABEL, "0")),
        terminating=bool(metadata.get("deletionTimestamp")),
        pod_ip=status.get("podIP"),
        created=metadata.get("creationTimestamp", ""),
        scheduled=bool((pod.get("spec") or {}).get("nodeName"))
        or any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions") or []),
    )
    terminated = (container.get("state") or {}).get("terminated")
    deletion = _deletion_asked(metadata)
    if status.get("reason") in NODE_LOST_REASONS:
        return WorkerObservation(
            **base,
            state=WorkerState.FAILED,
            failure_reason=status["reason"],
            failure_message=status.get("message", ""),
            failed_at=_earliest(deletion, _time((terminated or {}).get("finishedAt"))),
        )
    if phase == "Failed":
        message = ((terminated or {}).get("message") or status.get("message") or "").strip()
        ended = termination.failure_time(message) or _time((terminated or {}).get("finishedAt"))
        # Deleted before it ended: it failed on being stopped (SIGTERM's exit code 143), not of itself.
        stopped = deletion is not None and (ended is None or deletion <= ended)
        return WorkerObservation(
            **base,
            state=WorkerState.FAILED,
            failure_reason=POD_DELETED if stopped else (terminated or {}).get("reason") or status.get("reason") or "Failed",
            exit_code=(terminated or {}).get("exitCode"),
            failure_cause=termination.failure_cause(message),
            failure_message=message,
            failed_at=_earliest(deletion, ended),
        )
    if phase == "Succeeded":
        report = termination.final_report((terminated or {}).get("message") or "")
        return WorkerObservation(**base, state=WorkerState.SUCCEEDED, final_report=report)
    if phase == "Running":
        return WorkerObservation(**base, state=WorkerState.RUNNING, failed_at=deletion)
    pending_reason, pending_message = _pending_cause(status, container)
    return WorkerObservation(
        **base, state=WorkerState.PENDING, pending_reason=pending_reason, pending_message=pending_message, failed_at=deletion
    )


def _time(text: Any) -> datetime | None:
    """An RFC 3339 time from the pod (UTC where it names no zone), or None where it has none (or
    none that parses)."""
    try:
        moment = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _deletion_asked(metadata: dict[str, Any]) -> datetime | None:
    """When the pod's deletion was asked for: its deletionTimestamp is that moment plus the grace
    period. None for a pod not being deleted."""
    deadline = _time(metadata.get("deletionTimestamp"))
    if deadline is None:
        return None
    return deadline - timedelta(seconds=metadata.get("deletionGracePeriodSeconds") or 0)


def _earliest(*moments: datetime | None) -> datetime | None:
    known = [moment for moment in moments if moment is not None]
    return min(known, default=None)


def _pending_cause(status: dict[str, Any], container: dict[str, Any]) -> tuple[str, str]:
    """Why a pod is pending, and the message saying so; empty where nothing says."""
    waiting = (container.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in PERMANENT_IMAGE_REASONS:
        return INVALID_IMAGE, f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        return "ImagePullFailed", f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition.get("reason") or "Unschedulable", condition.get("message", "")
    return "", ""
