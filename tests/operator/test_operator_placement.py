"""Placement by the operator, a real process, against the Kubernetes API emulator holding Node
objects (Ready, with allocatable resources and topology labels) and pods with requests.

What this shows: what the operator reads (nodes and every namespace's pods), what it decides
(status.placement, Events, "why pending"), and what it sends (each pod's required node affinity
and CARAMEL_TOPOLOGY). What it cannot show: the emulator has no scheduler, so nothing binds the
pods to the nodes they are pinned to; the cluster suite (tests/cluster) checks that part.
"""

from __future__ import annotations

import re

import pytest

from caramel.contract.api import GangPlacement
from caramel.network.labels import ClusterLinks
from caramel.network.wire import from_json
from caramel_operator.gang_placement import placed_topology
from testbed.operator_harness import NODES, Emulator, Operator, eventually, node, terminated

LINKS = '{"rack": {"gbps": 10, "latencyUs": 20}}'
SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"]}
# Each worker takes a quarter of a default node: four fit on one.
WORKERS = {"replicas": 4, "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}
# rack-1's first node mostly taken by another namespace's pod, which placement must count.
BUSY = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "database", "namespace": "other"},
    "spec": {"nodeName": "rack-1-node-1", "containers": [{"name": "db", "image": "db", "resources": {"requests": {"cpu": "12", "memory": "60Gi"}}}]},
    "status": {"phase": "Running"},
}


@pytest.fixture
def emulator(tmp_path):
    emulator = Emulator(tmp_path)
    emulator.api.create("/api/v1/namespaces/other/pods", BUSY)
    yield emulator
    emulator.stop()


@pytest.fixture
def operator(emulator, tmp_path):
    operator = Operator(emulator, tmp_path, CARAMEL_TOPOLOGY_LINKS=LINKS)
    yield operator
    operator.stop()


def env(pod):
    return {var["name"]: var["value"] for var in pod["spec"]["containers"][0]["env"]}


def pinned_node(pod):
    [term] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return term["matchFields"][0]["values"][0]


def gang_of(api, job, gang):
    pods = api.pods(job)
    return len(pods) == 4 and all(p["metadata"]["labels"]["caramel.dev/gang"] == str(gang) for p in pods) and pods


def test_rstorm_pins_each_worker_and_hands_it_the_placed_topology(emulator, operator):
    api = emulator.api
    api.create_job("demo", {**SPEC, "workers": WORKERS})
    pods = eventually(lambda: gang_of(api, "demo", 0), what="the gang's four pods")
    placement = GangPlacement.model_validate(api.status("demo")["placement"])
    assert placement.by == "RStorm" and placement.gang == 0
    # The busy node is left out; the gang fills one node rather than spreading over the racks.
    assert [pinned_node(pod) for pod in pods] == [worker.node for worker in placement.workers]
    assert len({worker.node for worker in placement.workers}) == 1 and "rack-1-node-1" not in {w.node for w in placement.workers}
    expected = placed_topology(placement.workers, 1, ClusterLinks.model_validate_json(LINKS))
    assert all(from_json(env(pod)["CARAMEL_TOPOLOGY"]) == expected for pod in pods)
    placed = eventually(lambda: api.events("Placed"), what="a Placed Event")[0]
    assert placed["type"] == "Normal" and placed["message"] == "R-Storm placed 4 workers on 1 nodes in 1 racks (status.placement)"

    # A restart places the new gang afresh, not counting the old gang's pods against the nodes.
    api.run_pods("demo")
    api.set_pod_status("demo-worker-2", terminated(1))
    eventually(lambda: gang_of(api, "demo", 1), what="the restarted gang")
    assert api.status("demo")["placement"]["gang"] == 1
    pods = api.pods("demo")
    assert [pinned_node(pod) for pod in pods] == [w["node"] for w in api.status("demo")["placement"]["workers"]]


def test_a_gang_too_large_says_why_it_waits_and_is_placed_once_a_node_joins(emulator, operator):
    api = emulator.api
    api.create_job("big", {**SPEC, "workers": {**WORKERS, "replicas": 14}})
    message = eventually(lambda: api.status("big").get("message"), what="a pending message")
    assert message.startswith(
        "cannot place the gang: cannot place 14 workers (each 4 CPU, 16Gi memory); short of memory: free memory holds 12 of them"
    ), message
    [unplaceable, *_] = eventually(lambda: api.events("Unplaceable"), what="an Unplaceable Event")
    # Each pass that cannot place the gang says so in an Event and in the status, with its own
    # retry's backoff: the first Event may be a pass older than the status read above.
    why = message.rpartition("; trying again in ")[0]
    assert unplaceable["type"] == "Warning" and re.fullmatch(re.escape(why) + r"; trying again in \d+ s", unplaceable["message"]), unplaceable
    assert api.status("big")["phase"] == "Pending" and api.pods("big") == []
    api.create(NODES, node("rack-3-node-1", "rack-3", memory="128Gi"))
    eventually(lambda: len(api.pods("big")) == 14, timeout=30, what="the gang created after the retry")
    assert api.status("big")["message"] == ""


def test_the_scheduler_policy_leaves_the_pods_unpinned(emulator, operator):
    api = emulator.api
    api.create_job("free", {**SPEC, "workers": WORKERS, "placement": {"policy": "Scheduler"}})
    pods = eventually(lambda: gang_of(api, "free", 0), what="the gang's four pods")
    assert all("affinity" not in pod["spec"] and "CARAMEL_TOPOLOGY" not in env(pod) for pod in pods)
    placement = api.status("free")["placement"]
    assert (placement["gang"], placement["by"], placement["workers"]) == (0, "Scheduler", [])


def test_without_rights_on_nodes_auto_leaves_placement_to_the_scheduler_and_rstorm_waits(tmp_path):
    """`forbid` stands in for RBAC, which the emulator does not have: the namespaced variant
    grants no list on nodes."""
    emulator = Emulator(tmp_path, forbid=["nodes"])
    operator = Operator(emulator, tmp_path)
    try:
        api = emulator.api
        api.create_job("auto", {**SPEC, "workers": WORKERS})
        api.create_job("strict", {**SPEC, "workers": WORKERS, "placement": {"policy": "RStorm"}})
        pods = eventually(lambda: gang_of(api, "auto", 0), what="the Auto job's pods")
        assert all("affinity" not in pod["spec"] for pod in pods)
        unavailable = eventually(lambda: api.events("PlacementUnavailable"), what="a PlacementUnavailable Event")[0]
        assert "nodes is forbidden" in unavailable["message"] and "the scheduler places the gang" in unavailable["message"]
        message = eventually(lambda: api.status("strict").get("message"), what="the RStorm job's message")
        assert "spec.placement.policy RStorm) needs to list nodes and pods cluster-wide: nodes is forbidden" in message
        assert api.pods("strict") == []
    finally:
        operator.stop()
        emulator.stop()


def test_a_gpu_gang_goes_to_the_tainted_gpu_node_in_the_gpu_image_with_a_rank_per_gpu(emulator, operator):
    """The defaults of a GPU job (image, tolerations, slots) and GPUs as R-Storm's hard constraint:
    the CPU nodes have room for the gang's CPU and memory, not for its GPUs."""
    api = emulator.api
    gpu_node = node("gpu-node-1", "rack-2", cpu="32", memory="128Gi")
    gpu_node["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    gpu_node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    api.create(NODES, gpu_node)
    api.create_job("gpus", {**SPEC, "workers": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "4", "memory": "16Gi"}}}})
    pods = eventually(lambda: len(api.pods("gpus")) == 2 and api.pods("gpus"), what="the GPU gang's two pods")
    assert [pinned_node(pod) for pod in pods] == ["gpu-node-1", "gpu-node-1"]
    for pod in pods:
        assert pod["spec"]["containers"][0]["image"] == "caramel-runtime-gpu:0.1.0"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        assert (env(pod)["HOROVOD_LOCAL_SIZE"], env(pod)["HOROVOD_SIZE"], env(pod)["CARAMEL_GPUS_PER_WORKER"]) == ("2", "4", "2")
    assert len(from_json(env(pods[0])["CARAMEL_TOPOLOGY"]).hosts) == 4
