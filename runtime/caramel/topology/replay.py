"""A reference executor: runs a schedule on in-memory buffers, exactly by its rules.

It is the executable definition of what a schedule means (see `caramel.topology.schedule`): a
real executor, moving the same chunks between processes, must compute what this computes. Tests
run every algorithm's schedule through it, on numbers and on one-hot contributions (which show
any contribution counted twice or lost).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from caramel.topology.schedule import Schedule, Transfer, chunk_bounds, phase_steps


def replay(schedule: Schedule, buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every host's buffer after the all-reduce; `buffers[h]` is host h's contribution, cut into
    chunks along its first axis."""
    if len(buffers) != schedule.hosts:
        raise ValueError(f"the schedule is for {schedule.hosts} hosts, got {len(buffers)} buffers")
    state = [np.array(buffer, copy=True) for buffer in buffers]
    bounds = chunk_bounds(len(state[0]), schedule.chunks)
    _run(schedule.reduce_scatter, state, bounds, add=True)
    _run(schedule.all_gather, state, bounds, add=False)
    return state


def _run(transfers: Sequence[Transfer], state: list[np.ndarray], bounds: list[tuple[int, int]], add: bool) -> None:
    """One phase: what arrives at a step's start is delivered before that step's sends read."""
    starting, ending = defaultdict(list), defaultdict(list)
    for number, transfer in enumerate(transfers):
        starting[transfer.step].append(number)
        ending[transfer.end].append(number)
    in_flight: dict[int, np.ndarray] = {}
    for step in range(phase_steps(transfers) + 1):
        for number in ending[step]:
            transfer = transfers[number]
            start, stop = bounds[transfer.chunk]
            if add:
                state[transfer.dst][start:stop] += in_flight.pop(number)
            else:
                state[transfer.dst][start:stop] = in_flight.pop(number)
        for number in starting[step]:
            transfer = transfers[number]
            start, stop = bounds[transfer.chunk]
            in_flight[number] = state[transfer.src][start:stop].copy()
