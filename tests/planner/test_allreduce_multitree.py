"""MULTITREE's trees and schedule: spanning trees, links within capacity in every step, and
reduce-scatter + all-gather that deliver every chunk to every host."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from caramel.allreduce.multitree_schedule import build_trees, multitree
from caramel.allreduce.replay import replay
from caramel.network.labels import Position, gang_topology
from caramel.network.model import Link, Topology
from caramel.network.synthetic import STANDARD, mesh, racks, torus

TOPOLOGIES = {
    **STANDARD,
    "torus-3x5": lambda: torus(3, 5, 1e9),
    "mesh-2x3": lambda: mesh(2, 3, 1e9),
    "racks-3x3-uneven": lambda: Topology(
        hosts=tuple(f"h{i}" for i in range(9)),
        switches=("t0", "t1", "t2", "spine"),
        links=tuple(Link(f"h{i}", f"t{i // 3}", 1e9) for i in range(9))
        + (Link("t0", "spine", 2e9), Link("t1", "spine", 1e8), Link("t2", "spine", 3e8)),
    ),
    "gang-two-per-node": lambda: gang_topology([Position("z", f"z/r{i // 4}", f"n{i // 2}") for i in range(8)]),
    "one-host": lambda: Topology(hosts=("solo",), switches=(), links=()),
}


@pytest.fixture(params=sorted(TOPOLOGIES))
def topology(request) -> Topology:
    return TOPOLOGIES[request.param]()


def test_every_tree_spans_every_host_top_down(topology):
    trees = build_trees(topology)
    assert len(trees) == topology.size
    for root, edges in enumerate(trees):
        assert sorted(edge.child for edge in edges) == sorted(set(range(topology.size)) - {root})
        holds = {root: 0}  # host -> step from which it holds the root's chunk
        for edge in edges:
            assert edge.root == root and edge.parent in holds and edge.step >= holds[edge.parent]
            assert topology.hop_route(edge.parent, edge.child) is not None  # no host forwards
            holds[edge.child] = edge.step + edge.steps


def unit_bandwidth(topology: Topology) -> float:
    """The time unit's bandwidth: the fastest route between two hosts with no host between them."""
    routes = [topology.hop_route(a, b) for a in range(topology.size) for b in range(topology.size) if a != b]
    return max((float(topology.bandwidth[list(route)].min()) for route in routes if route), default=1.0)


def test_no_link_carries_more_than_it_can_in_any_step(topology):
    # A step moves one chunk at the unit bandwidth; a transfer of `steps` steps moves its chunk
    # at unit/steps, taking that share of each link on its route.
    schedule, unit = multitree(topology), unit_bandwidth(topology)
    for phase in (schedule.reduce_scatter, schedule.all_gather):
        use: dict[tuple[int, int], float] = defaultdict(float)
        for transfer in phase:
            for step in range(transfer.step, transfer.end):
                for link in topology.route(transfer.src, transfer.dst):
                    use[step, link] += unit / transfer.steps / topology.bandwidth[link]
        assert max(use.values(), default=0.0) <= 1 + 1e-9


@pytest.mark.parametrize("name", ["torus-4x4", "torus-8x8", "mesh-4x4", "fat-tree-k4"])
def test_on_equal_links_no_two_trees_use_a_link_in_the_same_step(name):
    topology = STANDARD[name]()
    schedule = multitree(topology)
    for phase in (schedule.reduce_scatter, schedule.all_gather):
        assert all(t.steps == 1 for t in phase)
        uses = defaultdict(int)
        for t in phase:
            for link in topology.route(t.src, t.dst):
                uses[t.step, link] += 1
        assert max(uses.values()) == 1


def test_reduce_scatter_then_all_gather_sums_every_contribution_exactly_once(topology):
    schedule = multitree(topology)
    size = topology.size
    # One-hot contributions: the result counts, for every element, how often each host's
    # contribution was added; all ones means each exactly once, everywhere.
    elements = 3 * size + 2  # uneven chunks
    onehot = [np.tile(np.eye(size)[host], (elements, 1)) for host in range(size)]
    assert all(np.array_equal(result, np.ones((elements, size))) for result in replay(schedule, onehot))
    numbers = [np.random.default_rng(host).standard_normal(elements) for host in range(size)]
    total = np.sum(numbers, axis=0)
    assert all(np.allclose(result, total) for result in replay(schedule, numbers))


def test_each_tree_is_responsible_for_its_own_chunk(topology):
    schedule = multitree(topology)
    assert schedule.chunks == topology.size
    for phase in (schedule.reduce_scatter, schedule.all_gather):
        per_chunk = defaultdict(int)
        for transfer in phase:
            per_chunk[transfer.chunk] += 1
        assert all(count == topology.size - 1 for count in per_chunk.values())
    # The root ends the reduce-scatter: nobody sends chunk r up to anyone after r has it all.
    assert all(t.src != t.chunk for t in schedule.reduce_scatter)
    assert all(t.dst != t.chunk for t in schedule.all_gather)


def test_the_trees_are_deterministic():
    topology = STANDARD["racks-2x8"]()
    assert build_trees(topology) == build_trees(STANDARD["racks-2x8"]())


def test_a_torus_needs_far_fewer_steps_than_a_ring():
    schedule = multitree(STANDARD["torus-4x4"]())
    # 16 trees of 15 edges over 64 directed links: at least 4 steps; the ring needs 15.
    assert 4 <= schedule.all_gather_steps <= 6 and schedule.reduce_scatter_steps == schedule.all_gather_steps


def test_trees_cross_each_slow_uplink_once_and_only_as_needed():
    topology = racks(2, 8, 1e9, 0.25e9)
    for edges in build_trees(topology):
        crossings = [e for e in edges if topology.groups[e.parent] != topology.groups[e.child]]
        assert len(crossings) == 1 and crossings[0].steps == 4  # an uplink at 1/4 of a host link
    # The uplinks are kept busy from the first step.
    first = min(e.step for edges in build_trees(topology) for e in edges if topology.groups[e.parent] != topology.groups[e.child])
    assert first == 0
