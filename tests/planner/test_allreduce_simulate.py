"""The link-level simulator: alpha-beta per link, contention, predictions and `auto`'s choice."""

from __future__ import annotations

import pytest

from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule
from caramel.allreduce.simulate import (
    ALGORITHMS,
    bytes_between_groups,
    choose_allreduce,
    cost,
    phase_cost,
    predict_seconds,
)
from caramel.network.labels import Position, gang_topology
from caramel.network.model import Link, Topology
from caramel.network.synthetic import STANDARD, racks

# Two hosts on one switch: a -> s -> b, each link 1 GB/s and 1 ms.
PAIR = Topology(hosts=("a", "b"), switches=("s",), links=(Link("a", "s", 1e9, 1e-3), Link("b", "s", 1e9, 1e-3)))
# Three hosts whose traffic to "c" shares the switch's link to it.
FAN_IN = Topology(
    hosts=("a", "b", "c"), switches=("s",), links=tuple(Link(host, "s", 1e9) for host in ("a", "b", "c"))
)


def test_a_lone_transfer_costs_its_route_latency_plus_bytes_over_bandwidth():
    line = phase_cost(PAIR, [ChunkTransfer(0, 0, 1, 0)], chunks=1)
    assert line.alpha == pytest.approx(2e-3) and line.beta == pytest.approx(1e-9)
    # A ring all-reduce of two hosts: one step a phase, half the buffer a step.
    assert predict_seconds("ring", PAIR, 10**6) == pytest.approx(2 * (2e-3 + 0.5e6 / 1e9))


def test_flows_sharing_a_link_share_its_bandwidth():
    alone = phase_cost(FAN_IN, [ChunkTransfer(0, 0, 2, 0)], chunks=1)
    shared = phase_cost(FAN_IN, [ChunkTransfer(0, 0, 2, 0), ChunkTransfer(0, 1, 2, 0)], chunks=1)
    apart = phase_cost(FAN_IN, [ChunkTransfer(0, 0, 2, 0), ChunkTransfer(0, 2, 1, 0)], chunks=1)
    assert shared.beta == pytest.approx(2 * alone.beta)
    assert apart.beta == pytest.approx(alone.beta)  # full duplex: opposite directions do not contend


def test_a_transfer_over_several_steps_spreads_its_bytes():
    two_steps = phase_cost(FAN_IN, [ChunkTransfer(0, 0, 2, 0, steps=2)], chunks=1)
    assert two_steps.beta == pytest.approx(phase_cost(FAN_IN, [ChunkTransfer(0, 0, 2, 0)], chunks=1).beta)


def test_predictions_are_lines_in_the_size():
    topology = STANDARD["racks-2x8"]()
    for algorithm in ALGORITHMS:
        line = cost(algorithm, topology)
        assert predict_seconds(algorithm, topology, 3 * 2**20) == pytest.approx(line.alpha + line.beta * 3 * 2**20)
        assert line.alpha > 0 and line.beta > 0


def test_the_ring_on_a_torus_takes_2_n_minus_1_steps_of_a_chunk():
    topology = STANDARD["torus-4x4"]()
    nbytes = 16 * 2**20
    step = nbytes / 16 / topology.bandwidth[0] + topology.latency[0]
    assert predict_seconds("ring", topology, nbytes) == pytest.approx(30 * step)


def test_unknown_algorithms_are_named():
    with pytest.raises(ValueError, match="unknown all-reduce algorithm 'bogus'; known: ring, halving-doubling"):
        predict_seconds("bogus", PAIR, 1)


def test_auto_takes_the_ring_on_a_flat_network_and_multitree_where_it_is_clearly_faster():
    flat = racks(1, 8, 1e9, 1e9)
    one_rack = gang_topology([Position("z", "z/r1", f"n{rank // 2}") for rank in range(16)])
    for size in (2**16, 2**20, 64 * 2**20):
        assert choose_allreduce(flat, size) == choose_allreduce(one_rack, size) == "ring"
    assert choose_allreduce(STANDARD["torus-4x4"](), 64 * 2**20) == "multitree"
    assert choose_allreduce(STANDARD["racks-2x8"](), 256 * 2**20) == "multitree"


def test_bytes_between_racks():
    topology = STANDARD["racks-2x8"]()
    nbytes = 16 * 2**20
    ring = ALGORITHMS["ring"](topology)
    # Every ring step crosses twice (7 -> 8 and 15 -> 0): 2 x 15 steps x 2 phases, a chunk each.
    assert bytes_between_groups(ring, topology, nbytes) == 60 * nbytes / 16
    # Each tree crosses once, in each phase.
    assert bytes_between_groups(ALGORITHMS["multitree"](topology), topology, nbytes) == 32 * nbytes / 16
    assert bytes_between_groups(Schedule("none", 1, 1, (), ()), racks(1, 1, 1.0, 1.0), nbytes) == 0
