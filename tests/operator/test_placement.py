"""R-Storm placement of a gang, and nodes' free resources (the placement benchmark's baselines:
test_placement_baselines.py)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from decimal import Decimal

import pytest

from caramel.network.labels import Position
from caramel_operator.node_resources import free_resources, pod_requests
from caramel_operator.placement import Gang, NodeFree, Unplaceable, ranked_by_topology, rstorm

GiB = 1024**3


def node(rack: str, name: str, cpu: float = 16, memory_gib: float = 64, zone: str = "z1") -> NodeFree:
    return NodeFree(Position(zone, f"{zone}/{rack}", name), cpu, memory_gib * GiB)


def cluster(racks: int = 3, per_rack: int = 4, cpu: float = 16, memory_gib: float = 64) -> list[NodeFree]:
    return [node(f"r{r}", f"r{r}-n{i}", cpu, memory_gib) for r in range(racks) for i in range(per_rack)]


def rack_of(name: str) -> str:
    return name.split("-")[0]


def test_memory_is_never_overcommitted():
    nodes = [node("r0", f"n{i}", memory_gib=10 + 7 * i) for i in range(6)]
    placement = rstorm(nodes, Gang(workers=9, cpu=1, memory=8 * GiB))
    free = {n.name: n.memory for n in nodes}
    for name, count in Counter(placement.nodes).items():
        assert count * 8 * GiB <= free[name]
    assert len(placement.nodes) == 9


def test_a_gang_that_fits_in_one_rack_stays_in_it():
    nodes = cluster(racks=3, per_rack=4)
    # The freest node is in r2, but rack r1 has the most free resources in total.
    nodes += [node("r1", f"r1-m{i}") for i in range(3)] + [node("r2", "r2-big", cpu=32, memory_gib=128)]
    placement = rstorm(nodes, Gang(workers=8, cpu=4, memory=16 * GiB))
    assert {rack_of(name) for name in placement.nodes} == {"r1"}


def test_the_first_worker_goes_to_the_freest_node_of_the_freest_rack():
    nodes = [node("r0", "r0-a", cpu=20, memory_gib=80), node("r1", "r1-a", cpu=12), node("r1", "r1-b", cpu=14)]
    placement = rstorm(nodes, Gang(workers=1, cpu=1, memory=GiB))
    assert placement.nodes == ("r1-b",)  # r1 has more free in total; r1-b is its freest node


def test_a_gang_larger_than_a_rack_fills_as_few_racks_as_it_can_and_ranks_follow_racks():
    nodes = cluster(racks=6, per_rack=4)  # each node holds 4 workers of 4 cores: 16 a rack
    placement = rstorm(nodes, Gang(workers=40, cpu=4, memory=16 * GiB))
    racks = [rack_of(name) for name in placement.nodes]
    assert len(set(racks)) == 3
    # Ranks are grouped by rack and by node: the ring crosses between racks once per rack.
    assert sum(racks[i] != racks[(i + 1) % len(racks)] for i in range(len(racks))) == 3
    changes = sum(placement.nodes[i] != placement.nodes[i + 1] for i in range(len(placement.nodes) - 1))
    assert changes == len(set(placement.nodes)) - 1


def test_placement_is_deterministic_whatever_the_order_of_the_nodes():
    nodes = cluster(racks=4, per_rack=5, cpu=10)
    shuffled = nodes[:]
    random.Random(7).shuffle(shuffled)
    gang = Gang(workers=13, cpu=3, memory=10 * GiB)
    assert rstorm(nodes, gang) == rstorm(shuffled, gang)


def test_cpu_is_soft_memory_is_hard():
    nodes = [node("r0", "a", cpu=2, memory_gib=64), node("r0", "b", cpu=8, memory_gib=8)]
    # Only "a" has the memory; it has too little CPU for two workers, but R-Storm places them.
    placement = rstorm(nodes, Gang(workers=2, cpu=2, memory=16 * GiB))
    assert placement.nodes == ("a", "a") and placement.cpu_short == ("a",)
    # Where some node has the memory and the CPU, CPU is respected.
    roomy = rstorm([*nodes, node("r0", "c", cpu=8, memory_gib=64)], Gang(workers=2, cpu=2, memory=16 * GiB))
    assert roomy.cpu_short == ()


def test_unplaceable_gangs_say_what_is_short():
    nodes = cluster(racks=2, per_rack=2, cpu=8, memory_gib=32)
    with pytest.raises(Unplaceable, match=r"cannot place 9 workers \(each 1 CPU, 16Gi memory\); short of memory: "
                       r"free memory holds 8 of them \(most free: 32Gi on r0-n0\)"):
        rstorm(nodes, Gang(workers=9, cpu=1, memory=16 * GiB))
    with pytest.raises(Unplaceable, match="no schedulable node"):
        rstorm([], Gang(workers=1, cpu=1, memory=GiB))
    with pytest.raises(ValueError, match="at least one worker"):
        rstorm(nodes, Gang(workers=0, cpu=1, memory=GiB))


def ready_node(name: str, cpu: str = "4", memory: str = "16Gi", **spec) -> dict:
    return {
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "z", "example.com/rack": "r1"}},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": memory}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(node_name: str, phase: str = "Running", **spec) -> dict:
    return {"spec": {"nodeName": node_name, **spec}, "status": {"phase": phase}}


def container(cpu: str, memory: str) -> dict:
    return {"resources": {"requests": {"cpu": cpu, "memory": memory}}}


def test_pod_requests_count_init_containers_and_overhead_as_the_scheduler_does():
    asked = pod_requests(
        pod("n", containers=[container("500m", "1Gi"), container("250m", "1Gi")],
            initContainers=[container("1", "512Mi")], overhead={"cpu": "100m"})
    )
    assert asked == {"cpu": Decimal("1.1"), "memory": 2 * GiB, "nvidia.com/gpu": 0}


def test_free_resources_subtract_running_pods_and_skip_unusable_nodes():
    nodes = [
        ready_node("a"),
        ready_node("cordoned", unschedulable=True),
        ready_node("tainted", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
        {**ready_node("down"), "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "False"}]}},
    ]
    pods = [
        pod("a", containers=[container("1500m", "4Gi")]),
        pod("a", phase="Succeeded", containers=[container("2", "8Gi")]),
        pod("tainted", containers=[container("1", "1Gi")]),
    ]
    free = free_resources(nodes, pods, rack_label="example.com/rack")
    assert [(n.name, n.cpu, n.memory, n.position.rack) for n in free] == [("a", 2.5, 12 * GiB, "z/r1")]
    tolerated = free_resources(nodes, pods, tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert [n.name for n in tolerated] == ["a", "tainted"]
    assert tolerated[0].position.rack == "z/node:a"  # no rack label of the default name


def test_a_container_stating_only_limits_requests_them():
    asked = pod_requests(pod("n", containers=[{"resources": {"limits": {"cpu": "2", "memory": "3Gi"}}},
                                              {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}}]))
    assert asked == {"cpu": Decimal(3), "memory": 3 * GiB, "nvidia.com/gpu": 0}


def test_free_pod_slots_are_allocatable_pods_minus_the_pods_on_the_node():
    nodes = [{**ready_node("a"), "status": {**ready_node("a")["status"], "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "3"}}},
             ready_node("b")]
    pods = [pod("a", containers=[]), pod("a", containers=[]), pod("a", phase="Failed", containers=[])]
    assert [(n.name, n.pods) for n in free_resources(nodes, pods)] == [("a", 1), ("b", float("inf"))]


def test_a_node_out_of_pod_slots_takes_no_worker():
    nodes = [NodeFree(Position("z", "z/r0", "full"), 64, 256 * GiB, pods=0), node("r0", "small", cpu=4, memory_gib=16),
             NodeFree(Position("z", "z/r0", "two-slots"), 64, 256 * GiB, pods=2)]
    gang = Gang(workers=3, cpu=1, memory=4 * GiB)
    assert Counter(rstorm(nodes, gang).nodes) == {"two-slots": 2, "small": 1}
    with pytest.raises(Unplaceable, match="pods: the nodes have room for 2 more pods"):
        rstorm(nodes[::2], gang)


def test_ranks_ordered_by_topology_keep_first_use_order():
    positions = {name: Position("z", f"z/{name[0]}", name) for name in ("a1", "a2", "b1", "c1")}
    assert ranked_by_topology(["b1", "a1", "c1", "a2", "b1", "a1"], positions) == ("b1", "b1", "a1", "a1", "a2", "c1")


def gpu_node(rack: str, name: str, gpus: float) -> NodeFree:
    return NodeFree(Position("z1", f"z1/{rack}", name), 64, 512 * GiB, gpus=gpus)


def test_gpus_are_a_hard_constraint_and_a_gpu_nodes_ranks_are_numbered_next_to_each_other():
    """A node without free GPUs never takes a GPU worker, however much CPU and memory it has; the
    workers of one node are neighbouring ranks (Horovod's hierarchical allreduce and MULTITREE's
    trees see the node boundary)."""
    nodes = [node("r0", "cpu-only", cpu=256, memory_gib=2048), gpu_node("r0", "g8", 8), gpu_node("r1", "g4-a", 4), gpu_node("r1", "g4-b", 4)]
    placement = rstorm(nodes, Gang(workers=4, cpu=8, memory=64 * GiB, gpus=4))
    assert "cpu-only" not in placement.nodes and Counter(placement.nodes) == {"g8": 2, "g4-a": 1, "g4-b": 1}
    runs = [name for name, _ in itertools.groupby(placement.nodes)]
    assert len(runs) == len(set(runs)) == 3  # each node's ranks adjacent
    with pytest.raises(Unplaceable, match=r"each 8 CPU, 64Gi memory, 4 GPU\); short of GPUs: free nvidia.com/gpu holds 4 of them \(most free: 8 on g8\)"):
        rstorm(nodes, Gang(workers=5, cpu=8, memory=64 * GiB, gpus=4))
    # A gang without GPUs may go anywhere, GPU nodes included.
    assert len(rstorm(nodes, Gang(workers=3, cpu=8, memory=64 * GiB)).nodes) == 3


def test_free_gpus_are_the_nodes_allocatable_ones_less_what_its_pods_hold():
    gpu_status = {**ready_node("g")["status"], "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}}
    nodes = [{**ready_node("g"), "status": gpu_status}, ready_node("plain")]
    pods = [pod("g", containers=[{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]), pod("g", phase="Succeeded", containers=[{"resources": {"limits": {"nvidia.com/gpu": "4"}}}])]
    assert [(n.name, n.gpus) for n in free_resources(nodes, pods)] == [("g", 5.0), ("plain", 0.0)]
