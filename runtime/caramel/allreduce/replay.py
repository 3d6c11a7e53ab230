"""A reference executor: runs a schedule on in-memory buffers, exactly by its rules.

It is the executable definition of what a schedule means (see `caramel.allreduce.chunk_schedule`):
every rank runs its own plan (`rank_steps`), as the executor on each process does, and an
executor moving the same chunks between processes must compute what this computes. Tests
run every algorithm's schedule through it, on numbers and on one-hot contributions (which show
any contribution counted twice or lost).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule, chunk_bounds, phase_steps, rank_steps


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


def _run(transfers: Sequence[ChunkTransfer], state: list[np.ndarray], bounds: list[tuple[int, int]], add: bool) -> None:
    """One phase, every rank running its own plan (`rank_steps`) step by step."""
    plans = [{entry.step: entry for entry in rank_steps(transfers, rank)} for rank in range(len(state))]
    in_flight: dict[ChunkTransfer, np.ndarray] = {}
    for step in range(phase_steps(transfers) + 1):
        for rank, plan in enumerate(plans):
            if step not in plan:
                continue
            for transfer in plan[step].receives:
                start, stop = bounds[transfer.chunk]
                if add:
                    state[rank][start:stop] += in_flight.pop(transfer)
                else:
                    state[rank][start:stop] = in_flight.pop(transfer)
            for transfer in plan[step].sends:
                start, stop = bounds[transfer.chunk]
                in_flight[transfer] = state[rank][start:stop].copy()
