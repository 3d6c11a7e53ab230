"""The test bed's free ports (testbed/ports.py): tests side by side never pick the same ports."""

from __future__ import annotations

import random

import pytest

from testbed import ports


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """A process that has handed out no port yet, outside pytest-xdist unless a test says so."""
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)


def test_each_xdist_worker_draws_from_a_range_of_its_own_below_the_ephemeral_ports(monkeypatch):
    everything = ports.port_range()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    shares = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        shares.append(ports.port_range())
        first = ports.free_port_block(9)
        assert shares[-1][0] <= first and first + 9 <= shares[-1][1]
    (first0, end0), (first1, end1) = shares
    assert everything[0] == first0 < end0 <= first1 < end1 <= everything[1] == ports._first_ephemeral_port()


def test_seeding_the_random_module_does_not_repeat_the_draw():
    """TensorFlow's set_random_seed seeds `random`: two workers that both seeded it drew alike."""
    draws = []
    for _ in range(2):
        random.seed(7)
        ports._handed_out.clear()
        draws.append([ports.free_port() for _ in range(5)])
    assert draws[0] != draws[1]


def test_blocks_handed_out_one_after_another_do_not_overlap(monkeypatch):
    """A job's rendezvous, metrics and transport blocks are picked before any is bound."""
    monkeypatch.setattr(ports, "port_range", lambda: (40000, 40200))  # room for 22 blocks of 9
    blocks = [set(range(first, first + 9)) for first in (ports.free_port_block(9) for _ in range(12))]
    assert sum(len(block) for block in blocks) == len(set().union(*blocks))
