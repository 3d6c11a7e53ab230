"""A link-level simulator of all-reduce schedules, and the predictions made with it.

The model (alpha-beta per link, contention counted). Every transfer follows its route
(`Topology.route`). The time steps of a schedule run one after another. In a step, every
transfer active in it puts its bytes for that step (its chunk, spread evenly over the steps it
lasts) on every link of its route; the step lasts as long as its most loaded link needs to
carry its load at its bandwidth (so flows sharing a link share its bandwidth: two flows on a
link take twice as long as one), plus the latency of the longest route starting in it. That is
the time a fluid network with the best rate allocation takes to move the step's traffic.

Every step's load is proportional to the buffer's size, so an algorithm's time on a topology is
a line in the buffer's size: `cost` gives its alpha (summed latencies) and beta (seconds per
byte), and `predict_seconds` evaluates it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache

import numpy as np

from caramel.allreduce.baseline_schedules import halving_doubling, hierarchical, ring
from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule, phase_steps
from caramel.allreduce.multitree_schedule import multitree
from caramel.network.model import Topology
from caramel.planner.linkmodel import LinkModel

ALGORITHMS: dict[str, Callable[[Topology], Schedule]] = {
    "ring": ring,
    "halving-doubling": halving_doubling,
    "hierarchical": hierarchical,
    "multitree": multitree,
}
"""The all-reduce algorithms the simulator knows, by name."""

AUTO_MARGIN = 1.1
"""`auto` takes MULTITREE only when it is predicted this many times faster than the ring:
the prediction ignores costs an executor adds (more, smaller messages), and the ring is
Horovod's own, well-tried path."""


def phase_cost(topology: Topology, transfers: Iterable[ChunkTransfer], chunks: int) -> LinkModel:
    """Alpha (seconds) and beta (seconds per byte of the whole buffer) of one phase."""
    transfers = list(transfers)
    steps = phase_steps(transfers)
    if not steps:
        return LinkModel(alpha=0.0, beta=0.0)
    load = np.zeros((steps, len(topology.bandwidth)))  # bytes per byte of chunk
    latency = np.zeros(steps)
    cells: tuple[list[int], list[int], list[float]] = ([], [], [])
    for transfer in transfers:
        route = topology.route(transfer.src, transfer.dst)
        for step in range(transfer.step, transfer.end):
            cells[0].extend([step] * len(route))
            cells[1].extend(route)
            cells[2].extend([1.0 / transfer.steps] * len(route))
        latency[transfer.step] = max(latency[transfer.step], topology.route_latency(route))
    np.add.at(load, (cells[0], cells[1]), cells[2])
    seconds_per_chunk_byte = (load / topology.bandwidth).max(axis=1).sum()
    return LinkModel(alpha=float(latency.sum()), beta=float(seconds_per_chunk_byte) / chunks)


@lru_cache(maxsize=256)
def cost(algorithm: str, topology: Topology) -> LinkModel:
    """An all-reduce's time on the topology as alpha + beta * bytes (both phases)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    schedule = ALGORITHMS[algorithm](topology)
    phases = [phase_cost(topology, phase, schedule.chunks) for phase in (schedule.reduce_scatter, schedule.all_gather)]
    return LinkModel(alpha=sum(p.alpha for p in phases), beta=sum(p.beta for p in phases))


def predict_seconds(algorithm: str, topology: Topology, nbytes: int) -> float:
    """Predicted seconds of one all-reduce of `nbytes` bytes with `algorithm` on `topology`."""
    return cost(algorithm, topology).seconds(nbytes)


def choose_allreduce(topology: Topology, nbytes: int) -> str:
    """What `auto` runs: "multitree" where it is predicted clearly faster than "ring", else "ring"."""
    ring_seconds = predict_seconds("ring", topology, nbytes)
    return "multitree" if predict_seconds("multitree", topology, nbytes) * AUTO_MARGIN < ring_seconds else "ring"


def bytes_between_groups(schedule: Schedule, topology: Topology, nbytes: int) -> float:
    """Bytes an all-reduce of `nbytes` sends between hosts of different groups (racks)."""
    groups = topology.groups
    crossing = sum(
        1 for phase in (schedule.reduce_scatter, schedule.all_gather) for t in phase if groups[t.src] != groups[t.dst]
    )
    return crossing * nbytes / schedule.chunks
