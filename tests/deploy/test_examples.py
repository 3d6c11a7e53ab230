"""The example CaramelJobs fit a small cluster: one node of 2 CPUs, as a small kind cluster has,
beside the operator and the system pods. The quickstart asked for 2 x 1 CPU: one worker ran, the
other waited for the gang timeout, and the job never ran.

"Fit" is what R-Storm placement (the operator's own code) says of the node: room for the whole
gang, with no worker on CPU it does not have free. What this cannot show: the scheduler's own
verdict, and whether the workers then train fast enough (the cluster suite runs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from caramel.contract.jobfile import parse_job
from caramel_operator.builders import build_worker_pod
from caramel_operator.gang_placement import Placed, place
from conftest import REPO
from testbed.operator_harness import RACK_LABEL, node

# One kind node: 2 CPUs, 7 GiB (a GitHub runner's memory, less than a laptop's Docker gives).
SMALL_NODE = node("kind-control-plane", "rack-1", cpu="2", memory="7Gi")
# What a kind control-plane node runs, with kubeadm's requests: CoreDNS (2 replicas), etcd, the
# API server, controller manager and scheduler, and kindnet (kube-proxy requests nothing).
SYSTEM_REQUESTS = {
    "coredns-1": ("100m", "70Mi"), "coredns-2": ("100m", "70Mi"), "etcd": ("100m", "100Mi"),
    "kube-apiserver": ("250m", "0"), "kube-controller-manager": ("200m", "0"), "kube-scheduler": ("100m", "0"),
    "kindnet": ("100m", "50Mi"),
}
CHART_VALUES = yaml.safe_load((REPO / "helm" / "caramel" / "values.yaml").read_text())
EXAMPLES = sorted((REPO / "examples").glob("*.yaml")) + [REPO / "manifests" / "example-carameljob.yaml"]


def bound_pod(name: str, requests: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "namespace": "kube-system"}, "status": {"phase": "Running"},
            "spec": {"nodeName": SMALL_NODE["metadata"]["name"], "containers": [{"name": name, "resources": {"requests": requests}}]}}


def caramel_jobs(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document and document.get("kind") == "CaramelJob"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: str(path.relative_to(REPO)))
def test_the_example_fits_a_two_cpu_node_beside_the_operator(path):
    [document] = caramel_jobs(path)
    job = parse_job(document, source=str(path))
    pods = [bound_pod(name, {"cpu": cpu, "memory": memory}) for name, (cpu, memory) in SYSTEM_REQUESTS.items()]
    pods.append(bound_pod("caramel-operator", CHART_VALUES["resources"]["requests"]))
    replicas = job.spec.workers.replicas
    outcome = place(job, build_worker_pod(job, 0, default_image="caramel-runtime:0.1.0"), [SMALL_NODE], pods, RACK_LABEL, replicas, replicas)
    assert isinstance(outcome, Placed), outcome
    assert outcome.cpu_short == (), f"{path.name}: its workers would wait for CPU on a 2-CPU node"
