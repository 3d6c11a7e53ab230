"""What the job is made of, created: its own objects (Service, NetworkPolicy) and the current
gang's pods, placed and admitted, in the size they are created in; and the API server's
refusals of those creations."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from caramel.contract.api import ConditionType, GangSize
from caramel_operator.builders import build_network_policy, build_service
from caramel_operator.gang_placement import placed_topology
from caramel_operator.lifecycle.actions import CreateObject, CreatePods
from caramel_operator.lifecycle.admit import gang_admitted
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass, gang_size, next_min_workers, of_replicas, size_on_record
from caramel_operator.lifecycle.place import placement
from caramel_operator.lifecycle.status import timestamp
from caramel_operator.observe import WorkerObservation


def create_own_objects(seen: Observed, p: Pass) -> None:
    """The job's headless Service, and its NetworkPolicy where the operator's settings ask, where missing."""
    objects = [build_service(seen.job)]
    if seen.settings.network_policy:
        objects.append(
            build_network_policy(
                seen.job,
                monitoring_namespace=seen.settings.monitoring_namespace,
                operator_namespace=seen.settings.operator_namespace,
            )
        )
    p.actions.extend(CreateObject(manifest) for manifest in objects if manifest["kind"] not in seen.existing)


def create_gang(seen: Observed, p: Pass, current: dict[int, WorkerObservation], sample_pod: dict[str, Any]) -> None:
    """The current gang's missing pods, once it is placed and, where new, admitted."""
    placed = placement(seen, p, current, sample_pod)
    if placed is None:
        return
    size = len(placed.workers) or gang_size(p) or next_min_workers(seen, p)
    if gang_size(p) is None:
        size_gang(seen, p, size)
    if not current and not gang_admitted(seen, p, size, sample_pod):
        return
    missing = [index for index in range(size) if index not in current]
    nodes: list[str | None] = [worker.node for worker in placed.workers] or [None] * size
    topology = placed_topology(placed.workers, seen.job.spec.workers.slots, seen.settings.links) if placed.workers else None
    pods = [
        seen.worker_pod(
            index,
            gang=p.status.gang,
            replicas=size,
            tuning=p.status.tuning,
            node=nodes[index],
            topology=topology,
            rendezvous_timeout_seconds=seen.settings.rendezvous_timeout_seconds,
        )
        for index in missing
    ]
    if pods:
        p.actions.append(CreatePods(pods))
    if not current:
        message = f"created {len(pods)} worker pods (gang {p.status.gang})"
        p.condition(ConditionType.CREATED, True, "GangCreated", message)
        p.event("Normal", "GangCreated", message)


def size_gang(seen: Observed, p: Pass, size: int) -> None:
    """Record the size of the gang being created; where it differs from the gang before, say
    so in the Resized condition and an Event."""
    before = size_on_record(seen, p)
    short = size < seen.replicas
    # Every way to fewer workers gives its reason; the fallback covers a spec edited since.
    reason = (before.reason or "no room for more") if short else ""
    timeout = timedelta(seconds=seen.settings.gang_scheduling_timeout_seconds)
    p.update(
        size=GangSize(
            gang=p.status.gang,
            workers=size,
            next_min_workers=size,
            reason=reason,
            next_look=timestamp(p.now + timeout) if short else None,
        )
    )
    if size == before.workers:
        return
    message = f"running {of_replicas(seen, size)}" + (f": {reason}" if short else " again")
    p.condition(ConditionType.RESIZED, short, "FewerWorkers" if short else "AllWorkers", message)
    p.event("Warning" if size < before.workers else "Normal", "Resized", message)


def report_creation_failures(p: Pass, failures: list[str]) -> Pass:
    """What the API server refused (Pod Security, quota, admission webhooks, RBAC), in the status
    and, when it changes, in a Warning event: otherwise only the operator's log would know."""
    if not failures:
        return p
    more = f" (and {len(failures) - 1} more refusals)" if len(failures) > 1 else ""
    message = f"cannot create the job's objects: {failures[0]}{more}"
    if message != p.status.message:
        p.event("Warning", "FailedCreate", message)
    p.update(message=message)
    return p
