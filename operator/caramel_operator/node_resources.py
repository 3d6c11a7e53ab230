"""The free resources and positions of a cluster's nodes, from Node and Pod objects as plain dicts.

What placement reads (RBAC: list nodes, list pods): a node's free CPU and memory are its
`status.allocatable` (and its free GPUs, nvidia.com/gpu) minus the requests of the pods bound to it (`spec.nodeName`) that have not
finished, as the scheduler counts them: a pod requests the larger of its containers' sum and its
largest init container, plus its overhead, and a container that states only a limit requests
that limit (the API server's defaulting). Its free pod slots are its allocatable `pods` minus
those pods. Nodes the gang cannot use are left out: unschedulable
(cordoned), not Ready, or tainted NoSchedule/NoExecute without a matching toleration.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from caramel.contract.api import GPU_RESOURCE
from caramel.network.labels import DEFAULT_RACK_LABEL, position
from caramel_operator.placement import NodeFree

RESOURCES = ("cpu", "memory", GPU_RESOURCE)
FINISHED_PHASES = {"Succeeded", "Failed"}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """CPU (cores), memory (bytes) and GPUs a pod requests, as the scheduler counts them."""
    spec = pod.get("spec", {})

    def requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources", {})
        asked, limits = resources.get("requests", {}), resources.get("limits", {})
        return {name: parse_quantity(asked.get(name, limits.get(name, 0))) for name in RESOURCES}

    containers = [requests(c) for c in spec.get("containers", [])]
    inits = [requests(c) for c in spec.get("initContainers", [])]
    overhead = spec.get("overhead") or {}
    return {
        name: max([sum((c[name] for c in containers), Decimal(0)), *(c[name] for c in inits)])
        + parse_quantity(overhead.get(name, 0))
        for name in RESOURCES
    }


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of the tolerations matches the taint (Kubernetes' rules)."""
    for toleration in tolerations:
        exists = toleration.get("operator") == "Exists"
        key_matches = toleration.get("key") == taint.get("key") or (exists and not toleration.get("key"))
        value_matches = exists or toleration.get("value", "") == taint.get("value", "")
        effect_matches = not toleration.get("effect") or toleration.get("effect") == taint.get("effect")
        if key_matches and value_matches and effect_matches:
            return True
    return False


def usable(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a gang's pod may be scheduled on the node."""
    spec, status = node.get("spec", {}), node.get("status", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    blocking = [t for t in spec.get("taints", []) if t.get("effect") in {"NoSchedule", "NoExecute"}]
    return ready and not spec.get("unschedulable") and all(tolerates(tolerations, taint) for taint in blocking)


def free_resources(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]] = (),
    rack_label: str = DEFAULT_RACK_LABEL,
) -> list[NodeFree]:
    """Each usable node's free CPU and memory and its position (see the module's docstring).

    `pods` are the pods whose requests count: the gang's own pods, when it is being re-placed,
    should not be among them.
    """
    used: dict[str, dict[str, Decimal]] = defaultdict(lambda: {name: Decimal(0) for name in RESOURCES})
    pods_on: dict[str, int] = defaultdict(int)
    for pod in pods:
        where = pod.get("spec", {}).get("nodeName")
        if where and pod.get("status", {}).get("phase") not in FINISHED_PHASES:
            pods_on[where] += 1
            for name, amount in pod_requests(pod).items():
                used[where][name] += amount
    free = []
    for node in nodes:
        if not usable(node, tolerations):
            continue
        metadata, allocatable = node["metadata"], node.get("status", {}).get("allocatable", {})
        left = {name: parse_quantity(allocatable.get(name, 0)) - used[metadata["name"]][name] for name in RESOURCES}
        free.append(
            NodeFree(
                position=position(metadata["name"], metadata.get("labels", {}), rack_label),
                cpu=float(left["cpu"]),
                memory=float(left["memory"]),
                gpus=float(left[GPU_RESOURCE]),
                pods=float(parse_quantity(allocatable["pods"])) - pods_on[metadata["name"]]
                if "pods" in allocatable
                else math.inf,
            )
        )
    return free
