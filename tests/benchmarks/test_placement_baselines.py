"""The placement benchmark's baselines (`benchmarks.placement_bench`): Kubernetes' default
scheduler's spread and a random placement, on the operator's model of the nodes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from benchmarks.placement_bench import random_placement, spread
from caramel.network.labels import Position
from caramel_operator.placement import Gang, NodeFree, Unplaceable

GiB = 1024**3


def node(name: str, cpu: float = 16, memory_gib: float = 64, rack: str = "r0") -> NodeFree:
    return NodeFree(Position("z1", f"z1/{rack}", name), cpu, memory_gib * GiB)


def cluster(racks: int = 3, per_rack: int = 4, cpu: float = 16, memory_gib: float = 64) -> list[NodeFree]:
    return [node(f"r{r}-n{i}", cpu, memory_gib, rack=f"r{r}") for r in range(racks) for i in range(per_rack)]


def test_spread_is_deterministic_whatever_the_order_of_the_nodes():
    nodes, gang = cluster(racks=4, per_rack=5, cpu=10), Gang(workers=13, cpu=3, memory=10 * GiB)
    assert spread(nodes, gang) == spread(random.Random(7).sample(nodes, len(nodes)), gang)


def test_the_baselines_hold_cpu_hard_and_say_what_is_short():
    nodes = cluster(racks=2, per_rack=2, cpu=8, memory_gib=32)
    with pytest.raises(Unplaceable, match=r"short of cpu: free CPU holds 4 of them \(most free: 8 on r0-n0\)"):
        spread(nodes, Gang(workers=5, cpu=8, memory=GiB))
    lopsided = [node("cpu-rich", cpu=8, memory_gib=1), node("memory-rich", cpu=1, memory_gib=8)]
    with pytest.raises(Unplaceable, match="short of cpu and memory: nodes with both free hold 0 of them"):
        random_placement(lopsided, Gang(workers=1, cpu=2, memory=2 * GiB))


def test_spread_puts_each_worker_on_the_freest_node():
    nodes = cluster(racks=3, per_rack=4)
    placement = spread(nodes, Gang(workers=12, cpu=4, memory=16 * GiB))
    assert len(set(placement.nodes)) == 12


def test_random_placement_is_feasible_and_seeded():
    nodes = cluster(racks=3, per_rack=4, cpu=8, memory_gib=32)
    gang = Gang(workers=20, cpu=2, memory=8 * GiB)
    first = random_placement(nodes, gang, seed=3)
    assert first == random_placement(nodes, gang, seed=3) != random_placement(nodes, gang, seed=4)
    assert max(Counter(first.nodes).values()) <= 4


def test_a_node_out_of_pod_slots_takes_no_worker():
    nodes = [NodeFree(Position("z", "z/r0", "full"), 64, 256 * GiB, pods=0), node("small", cpu=4, memory_gib=16),
             NodeFree(Position("z", "z/r0", "two-slots"), 64, 256 * GiB, pods=2)]
    gang = Gang(workers=3, cpu=1, memory=4 * GiB)
    for place in (spread, random_placement):
        assert Counter(place(nodes, gang).nodes) == {"two-slots": 2, "small": 1}
