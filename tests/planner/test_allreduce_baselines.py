"""The baseline schedules (ring, halving-doubling, hierarchical) and the schedule helpers."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.allreduce.baseline_schedules import halving_doubling, hierarchical, ring
from caramel.allreduce.chunk_schedule import Schedule, chunk_bounds, rank_steps
from caramel.allreduce.replay import replay
from caramel.network.model import Topology
from caramel.network.synthetic import STANDARD, racks, torus


def all_reduces(schedule: Schedule) -> bool:
    """Every host ends with every host's one-hot contribution exactly once, in every element."""
    size, elements = schedule.hosts, 2 * schedule.chunks + 1
    onehot = [np.tile(np.eye(size)[host], (elements, 1)) for host in range(size)]
    return all(np.array_equal(result, np.ones((elements, size))) for result in replay(schedule, onehot))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 12, 16])
@pytest.mark.parametrize("algorithm", [ring, halving_doubling])
def test_ring_and_halving_doubling_all_reduce_any_size(algorithm, size):
    assert all_reduces(algorithm(racks(1, size, 1.0, 1.0)))


@pytest.mark.parametrize("shape", [(1, 4), (4, 1), (2, 8), (4, 8), (3, 3)])
def test_hierarchical_all_reduces(shape):
    assert all_reduces(hierarchical(racks(*shape, 1.0, 1.0)))


def test_step_counts():
    topology = racks(4, 4, 1.0, 1.0)
    assert ring(topology).reduce_scatter_steps == ring(topology).all_gather_steps == 15
    assert halving_doubling(topology).all_gather_steps == 4
    assert halving_doubling(racks(1, 12, 1.0, 1.0)).reduce_scatter_steps == 4  # fold, then 3 halvings
    assert hierarchical(topology).reduce_scatter_steps == 3 + 3


def test_hierarchical_sends_only_a_share_across_groups():
    topology = racks(2, 8, 1.0, 1.0)
    crossing = [t for t in hierarchical(topology).reduce_scatter if topology.groups[t.src] != topology.groups[t.dst]]
    assert len(crossing) == 16  # one chunk each way per position: 1/8 of the buffer per host


def test_hierarchical_needs_equal_groups():
    grid = torus(3, 4, 1.0)
    uneven = Topology(grid.hosts, grid.switches, grid.links, ("a",) * 5 + ("b",) * 7)
    with pytest.raises(ValueError, match="groups of equal size; got a: 5, b: 7"):
        hierarchical(uneven)


def test_numbers_sum_exactly_where_they_should():
    topology = STANDARD["racks-2x8"]()
    numbers = [np.random.default_rng(host).standard_normal(37) for host in range(topology.size)]
    for algorithm in (ring, halving_doubling, hierarchical):
        assert all(np.allclose(result, np.sum(numbers, axis=0)) for result in replay(algorithm(topology), numbers))


def test_replay_refuses_the_wrong_number_of_buffers():
    with pytest.raises(ValueError, match="for 4 hosts, got 3 buffers"):
        replay(ring(racks(1, 4, 1.0, 1.0)), [np.zeros(4)] * 3)


def test_chunk_bounds_cover_the_buffer_evenly():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_a_rank_completes_its_receives_before_its_sends_of_the_same_step():
    schedule = ring(racks(1, 3, 1.0, 1.0))
    plan = rank_steps(schedule.reduce_scatter, rank=1)
    assert [(entry.step, len(entry.receives), len(entry.sends)) for entry in plan] == [(0, 0, 1), (1, 1, 1), (2, 1, 0)]
    # In step 1, rank 1 forwards the chunk it has just received from rank 0 (with its own added).
    assert plan[1].receives[0].chunk == plan[1].sends[0].chunk == 0
    assert plan[1].receives[0].src == 0 and plan[1].sends[0].dst == 2
