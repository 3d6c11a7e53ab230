"""Pure builders: a CaramelJob in, the Kubernetes objects that run it out.

No API calls and no kopf here, so every object the operator creates can be checked in a unit
test. Workers get stable names and DNS (`<job>-worker-<i>.<job>.<namespace>.svc`, through a
headless Service) and their environment from the same contract `caramel run` uses.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from caramel.contract.api import CaramelJob, Tuning
from caramel.contract.termination import TERMINATION_MESSAGE_PATH_VARIABLE
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, worker_command, worker_env, worker_name
from caramel.contract.ports import PortMap
from caramel.network.model import Topology
from caramel.network.wire import to_wire
from caramel_operator.gang_schedulers import gang_scheduler
from caramel_operator.labels import GANG_LABEL, JOB_LABEL, WORKER_INDEX_LABEL
from caramel_operator.podsecurity import restricted_violations

WORKER_CONTAINER = "worker"
# The labels of the operator's own pod (chart and manifests), which may scrape workers' metrics.
OPERATOR_POD_LABELS = {"app.kubernetes.io/part-of": "caramel", "app.kubernetes.io/component": "operator"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Where a worker writes its final progress report, which becomes the container's termination
# message: the operator reads the last step from it once the metrics endpoint is gone.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

# The image's user (Dockerfile). Group ownership of volumes (fsGroup) lets it write checkpoints
# to a PersistentVolumeClaim or an emptyDir, whose directories the kubelet creates as root.
WORKER_UID = 10001
# What Pod Security "restricted" requires, as defaults that spec.workers.template may change:
# a change that still passes "restricted" is the user's choice; one that fails it is refused.
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": WORKER_UID,
    "runAsGroup": WORKER_UID,
    "fsGroup": WORKER_UID,
    # Re-own a volume only when its root is not the fsGroup's yet: large checkpoints stay fast.
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def job_labels(job: CaramelJob) -> dict[str, str]:
    """Kubernetes' recommended labels, plus the label that selects a job's pods."""
    return {
        "app.kubernetes.io/name": "caramel",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/managed-by": "caramel-operator",
        JOB_LABEL: job.name,
    }


def worker_address(job: CaramelJob, worker_index: int) -> str:
    """The DNS name of a worker pod, given by the headless Service."""
    return f"{worker_name(job, worker_index)}.{job.name}.{job.metadata.namespace}.svc"


def peer_addresses(job: CaramelJob, replicas: int) -> list[str]:
    """The addresses of a gang of `replicas` workers."""
    return [worker_address(job, index) for index in range(replicas)]


def build_service(job: CaramelJob) -> dict[str, Any]:
    """The headless Service that gives every worker pod a DNS name."""
    rendezvous = PortMap.of(job).rendezvous
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job.name, "namespace": job.metadata.namespace, "labels": job_labels(job)},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job.name},
            # Workers must resolve each other before they are ready: that is how they meet.
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": "rendezvous", "port": rendezvous, "targetPort": rendezvous},
                {"name": "metrics", "port": job.spec.metrics.port, "targetPort": job.spec.metrics.port},
            ],
        },
    }


def build_worker_pod(
    job: CaramelJob,
    worker_index: int,
    *,
    default_image: str,
    gang: int = 0,
    replicas: int | None = None,
    tuning: Tuning | None = None,
    node: str | None = None,
    topology: Topology | None = None,
    rendezvous_timeout_seconds: float = RENDEZVOUS_TIMEOUT_SECONDS,
    gpu_tolerations: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Worker pod `worker_index` of gang generation `gang`, with spec.workers.template merged in.

    `default_image`: the image where the job names none; `replicas`: the gang's workers
    (spec.workers.replicas where not given; fewer while they do not all fit); `node`: the node
    placement chose for the worker, which the pod is pinned to; `topology`: the network under the
    placed gang, one host per rank, handed to the worker (CARAMEL_TOPOLOGY);
    `rendezvous_timeout_seconds`: how long its workers wait for each other; `gpu_tolerations`:
    added, beside the template's, where the job asks for GPUs (the taints of GPU nodes).
    """
    spec = job.spec
    replicas = spec.workers.replicas if replicas is None else replicas
    name = worker_name(job, worker_index)
    wire = to_wire(topology) if topology is not None else None
    env = worker_env(job, worker_index, peer_addresses(job, replicas), tuning, wire, rendezvous_timeout_seconds)
    labels = {**job_labels(job), WORKER_INDEX_LABEL: str(worker_index), GANG_LABEL: str(gang)}
    annotations: dict[str, str] = {}
    port_map = PortMap.of(job)
    ports = []
    if port_map.metrics is not None:
        ports += [
            {"name": f"metrics-{slot}", "containerPort": port}
            for slot, port in enumerate(port_map.of_one_worker(port_map.metrics))
        ]
    if worker_index == 0:
        ports.append({"name": "rendezvous", "containerPort": port_map.rendezvous})
    env[TERMINATION_MESSAGE_PATH_VARIABLE] = TERMINATION_MESSAGE_PATH
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.image or default_image,
        "command": worker_command(job),
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "ports": ports,
        # Quantities as the API writes them, strings: the client refuses a job's `nvidia.com/gpu: 2`.
        "resources": {
            kind: {name: str(amount) for name, amount in amounts.items()}
            for kind, amounts in spec.workers.resources.model_dump(exclude_defaults=True).items()
        },
        # A failed worker's last log lines become its termination message, which the
        # operator copies into the job's status.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job.metadata.namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "hostname": name,
            "subdomain": job.name,
            # The operator restarts the whole gang; a lone worker restarting in place would
            # only wait forever for peers that have moved on.
            "restartPolicy": "Never",
            "containers": [container],
        },
    }
    security = {"spec": {"securityContext": POD_SECURITY_CONTEXT, "containers": [{"name": WORKER_CONTAINER, "securityContext": CONTAINER_SECURITY_CONTEXT}]}}
    pod = merge_template(pod, _merge(copy.deepcopy(security), copy.deepcopy(spec.workers.template)))
    if spec.workers.resources.gpus:
        # Beside the template's own, which the merge would otherwise replace.
        tolerations = pod["spec"].get("tolerations") or []
        pod["spec"]["tolerations"] = [*tolerations, *(t for t in gpu_tolerations if t not in tolerations)]
    # After the template: the gang scheduler's labels, annotations and schedulerName win over it.
    gang_scheduler(job).decorate(pod, job, gang, replicas)
    if node is not None:
        pod["spec"]["affinity"] = pinned_to_node(pod["spec"].get("affinity"), node)
    return pod


def pinned_to_node(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """The affinity with a required node affinity to `node` added, keeping the template's own.

    Required node selector terms are ORed, so the pin joins every one of the template's terms
    (each still has to hold, on this node) rather than becoming a term of its own, which would
    let the pod onto the node whatever the template's terms say. Preferences and pod
    (anti-)affinity are kept as they are.
    """
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    result = copy.deepcopy(affinity or {})
    node_affinity = result.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**term, "matchFields": [*(term.get("matchFields") or []), pin]} for term in terms]
    return result


def worker_pod_problems(job: CaramelJob, *, default_image: str) -> list[str]:
    """Why the job's worker pods would be refused where Pod Security "restricted" is enforced,
    each naming the field of spec.workers.template (the builders' own part always passes)."""
    pod = build_worker_pod(job, 0, default_image=default_image)
    violations = restricted_violations(pod["spec"], pod["metadata"].get("annotations"))
    return [
        f"spec.workers.template.{v.field if v.field.startswith('metadata.') else 'spec.' + v.field}: "
        f'{v.rule} (Pod Security "restricted")'
        for v in violations
    ]


def build_network_policy(job: CaramelJob, *, monitoring_namespace: str, operator_namespace: str) -> dict[str, Any]:
    """Ingress to the job's workers: from each other on every port (Gloo picks its ports at run
    time), and to the metrics ports from the monitoring namespace and the operator."""
    port_map = PortMap.of(job)
    own_pods = {"podSelector": {"matchLabels": {JOB_LABEL: job.name}}}
    ingress: list[dict[str, Any]] = [{"from": [own_pods]}]
    if port_map.metrics is not None:
        operator_peer: dict[str, Any] = {"podSelector": {"matchLabels": OPERATOR_POD_LABELS}}
        operator_peer["namespaceSelector"] = (
            {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}} if operator_namespace else {}
        )
        peers = [operator_peer]
        if monitoring_namespace:
            peers.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: monitoring_namespace}}})
        metrics = port_map.of_one_worker(port_map.metrics)
        port: dict[str, Any] = {"protocol": "TCP", "port": metrics[0]}
        if len(metrics) > 1:
            port["endPort"] = metrics[-1]
        ingress.append({"from": peers, "ports": [port]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": job.name, "namespace": job.metadata.namespace, "labels": job_labels(job)},
        "spec": {"podSelector": own_pods["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_worker_pods(
    job: CaramelJob, *, default_image: str, gang: int = 0, tuning: Tuning | None = None
) -> list[dict[str, Any]]:
    return [
        build_worker_pod(job, index, default_image=default_image, gang=gang, tuning=tuning)
        for index in range(job.spec.workers.replicas)
    ]


def merge_template(pod: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The pod with a PodTemplateSpec fragment merged in: maps deeply, containers by name.

    Caramel's own labels, env and command win over the template where both set them, so a
    template cannot break the gang's wiring.
    """
    return _merge(copy.deepcopy(template), pod)


def _merge(base: Any, winner: Any) -> Any:
    if isinstance(base, dict) and isinstance(winner, dict):
        result = dict(base)
        for key, value in winner.items():
            result[key] = _merge(base[key], value) if key in base else value
        return result
    if _named_list(base) and _named_list(winner):
        by_name = {item["name"]: item for item in base}
        merged = [_merge(by_name.pop(item["name"], {}), item) for item in winner]
        return merged + list(by_name.values())
    return winner


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) and "name" in item for item in value)
