"""A job's gang placement, from the job and the cluster's Node and Pod objects as plain dicts (pure).

- `placed_by`: who places the gang under spec.placement.policy (R-Storm, the scheduler or the
  job's gang scheduler, gang_schedulers.py);
  Auto leaves to the scheduler the gangs that ask for resources R-Storm does not weigh (extended
  resources but GPUs, huge pages).
- `place`: R-Storm over the nodes the workers may use, as the scheduler reads the worker pod:
  its nodeSelector and required node affinity (`admits`), its tolerations, and what it requests,
  sidecars and overhead included; as many workers as fit within the sizes the lifecycle allows.
  The gang's own pods do not count against the nodes (a restart frees them).
- `placed_topology`: the network under the placed workers, one host per rank, for the workers'
  CARAMEL_TOPOLOGY.

The handlers read the nodes and pods (RBAC: list nodes, list pods cluster-wide) when the lifecycle
asks (`PlaceGang`), and the lifecycle records the outcome in the job's status (lifecycle/place.py);
nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from caramel.contract.api import GPU_RESOURCE, CaramelJob, PlacedBy, PlacementPolicy, WorkerNode
from caramel.network.labels import ClusterLinks, Position, gang_topology
from caramel.network.model import Topology
from caramel_operator.builders import JOB_LABEL
from caramel_operator.gang_schedulers import gang_scheduler, kueue_topology_annotations
from caramel_operator.node_resources import free_resources, pod_requests
from caramel_operator.placement import Gang, Unplaceable, largest_fit, rstorm


@dataclass(frozen=True)
class Placed:
    """R-Storm's placement: each worker's node, in rank order."""

    workers: tuple[WorkerNode, ...]
    cpu_short: tuple[str, ...] = ()
    """Nodes given more CPU than they have free."""


@dataclass(frozen=True)
class NoRoom:
    """No placement fits; the message says what is short."""

    message: str


@dataclass(frozen=True)
class Unreadable:
    """The operator may not read the nodes or pods placement needs; the API server's refusal."""

    message: str


Outcome = Placed | NoRoom | Unreadable


def unweighed_resources(worker_pod: Mapping[str, Any]) -> list[str]:
    """What the worker pod asks for that R-Storm does not weigh: extended resources (device
    plugins' resources, named with a domain) but GPUs, which it weighs, and huge pages."""
    spec = worker_pod.get("spec") or {}
    names = {
        name
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for kind in ("requests", "limits")
        for name in ((container.get("resources") or {}).get(kind) or {})
        if ("/" in name and name != GPU_RESOURCE) or name.startswith("hugepages-")
    }
    return sorted(names)


def placed_by(job: CaramelJob, worker_pod: Mapping[str, Any]) -> tuple[PlacedBy, str]:
    """Who places the gang of `worker_pod`s under spec.placement.policy, before anything is read
    from the cluster, and why when Auto does not take R-Storm for another reason than a gang scheduler."""
    policy = job.spec.placement.policy
    if policy is PlacementPolicy.SCHEDULER:
        return PlacedBy.SCHEDULER, ""
    if policy is PlacementPolicy.RSTORM:
        return PlacedBy.RSTORM, ""
    scheduler = gang_scheduler(job).placed_by
    if scheduler is not None:
        return scheduler, ""
    if kueue_topology_annotations(job):
        return PlacedBy.KUEUE, ""
    unweighed = unweighed_resources(worker_pod)
    if unweighed:
        # Pinned by R-Storm, the workers could land where none of these is free, and wait forever.
        return PlacedBy.SCHEDULER, (
            f"R-Storm weighs CPU, memory and GPUs only and the workers ask for {', '.join(unweighed)}: the scheduler places "
            "the gang (spec.placement.policy RStorm would place it anyway)"
        )
    return PlacedBy.RSTORM, ""


def placement_problems(job: CaramelJob) -> list[str]:
    """Placement and gang scheduling settings that contradict each other, each naming the field."""
    problems = gang_scheduler(job).problems(job)
    requested = kueue_topology_annotations(job)
    if job.spec.placement.policy is PlacementPolicy.RSTORM and requested:
        problems.append(
            "spec.placement.policy: RStorm pins every worker to a node, which contradicts the topology-aware "
            f"scheduling spec.workers.template.metadata.annotations asks Kueue for ({requested[0]}); "
            "use Auto to let Kueue place the gang, or remove the annotation"
        )
    return problems


def place(
    job: CaramelJob,
    worker_pod: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    rack_label: str,
    min_workers: int,
    replicas: int,
) -> Placed | NoRoom:
    """R-Storm's placement of the job's gang of `worker_pod`s (worker 0's pod as built) over the
    cluster's `nodes`, less what `pods` request: the most workers from `min_workers` to `replicas`
    that fit (`largest_fit`), or NoRoom saying what is short of `min_workers`."""
    spec = worker_pod["spec"]
    admitted = [node for node in nodes if admits(spec, node)]
    if nodes and not admitted:
        return NoRoom(f"none of the {len(nodes)} nodes matches the nodeSelector and node affinity of spec.workers.template")
    others = [pod for pod in pods if not _of_job(pod, job)]
    free = free_resources(admitted, others, spec.get("tolerations") or [], rack_label)
    if admitted and not free:
        return NoRoom(
            f"none of the {len(admitted)} nodes the workers may use is schedulable: each is cordoned, not Ready, "
            "or tainted without a matching toleration in spec.workers.template"
        )
    requests = pod_requests(worker_pod)
    widest = Gang(
        workers=replicas, cpu=float(requests["cpu"]), memory=float(requests["memory"]), gpus=float(requests[GPU_RESOURCE])
    )
    gang = replace(widest, workers=largest_fit(free, widest, min_workers))
    try:
        placement = rstorm(free, gang)
    except Unplaceable as error:
        return NoRoom(str(error))
    where = {node.name: node.position for node in free}
    workers = tuple(
        WorkerNode(node=name, rack=where[name].rack, zone=where[name].zone) for name in placement.nodes
    )
    return Placed(workers=workers, cpu_short=placement.cpu_short)


def placed_topology(workers: Sequence[WorkerNode], slots_per_worker: int, links: ClusterLinks) -> Topology:
    """The network under placed workers: one host per rank (rank r on worker r // slots)."""
    positions = [Position(zone=w.zone, rack=w.rack, node=w.node) for w in workers for _ in range(slots_per_worker)]
    return gang_topology(positions, links)


def admits(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a pod's nodeSelector and required node affinity let it run on the node, by the
    scheduler's rules (taints and readiness are `free_resources`' part)."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if any(labels.get(key) != value for key, value in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    fields = {"metadata.name": metadata.get("name", "")}
    # Terms are ORed; within a term every expression must hold.
    return any(_term_admits(term, labels, fields) for term in required.get("nodeSelectorTerms") or [])


def _term_admits(term: Mapping[str, Any], labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
    expressions, field_expressions = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not field_expressions:
        return False  # Kubernetes: an empty term matches no node
    return all(_holds(e, labels) for e in expressions) and all(_holds(e, fields) for e in field_expressions)


def _holds(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator, wanted = requirement.get("key", ""), requirement.get("operator"), requirement.get("values") or []
    if operator == "In":
        return key in values and values[key] in wanted
    if operator == "NotIn":
        return key not in values or values[key] not in wanted
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    if operator in ("Gt", "Lt"):
        try:
            have, bound = int(values[key]), int(wanted[0])
        except (KeyError, IndexError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _of_job(pod: Mapping[str, Any], job: CaramelJob) -> bool:
    metadata = pod.get("metadata") or {}
    return metadata.get("namespace") == job.metadata.namespace and (metadata.get("labels") or {}).get(JOB_LABEL) == job.name
