"""All-reduce schedules: which host sends which chunk to which host, in which time step.

An all-reduce of a buffer over N hosts cuts the buffer into `chunks` contiguous chunks, as
even as possible (`chunk_bounds`), and runs two phases:
- reduce-scatter: a transfer sends the sender's partial sum of the chunk, and the receiver
  adds it to its own partial sum;
- all-gather: a transfer sends the finished chunk, and the receiver keeps it.
A transfer starts at time step `step` and lasts `steps` steps (more than one only where a link
is slower than the schedule's time unit). A sender sends what it holds when the transfer
starts; a receiver has it when the transfer ends. The all-gather starts when the reduce-scatter
has ended. `rank_steps` is one rank's part of a phase, what the executor on that rank runs;
`caramel.allreduce.replay` runs every rank's part on in-memory buffers, the executable
definition of these rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkTransfer:
    """One chunk sent from one host to another (hosts by rank)."""

    step: int
    src: int
    dst: int
    chunk: int
    steps: int = 1

    @property
    def end(self) -> int:
        return self.step + self.steps


@dataclass(frozen=True)
class Schedule:
    """The two phases of an all-reduce over `hosts` hosts, on a buffer cut into `chunks` chunks."""

    algorithm: str
    hosts: int
    chunks: int
    reduce_scatter: tuple[ChunkTransfer, ...]
    all_gather: tuple[ChunkTransfer, ...]

    @property
    def reduce_scatter_steps(self) -> int:
        return phase_steps(self.reduce_scatter)

    @property
    def all_gather_steps(self) -> int:
        return phase_steps(self.all_gather)


def phase_steps(transfers: Iterable[ChunkTransfer]) -> int:
    """Time steps a phase lasts: until its last transfer ends."""
    return max((transfer.end for transfer in transfers), default=0)


@dataclass(frozen=True)
class RankStep:
    """What one rank does at one time step of a phase, in this order."""

    step: int
    receives: tuple[ChunkTransfer, ...]
    """Transfers to this rank that end at this step: finish them (adding, in a reduce-scatter)
    before the sends, which may forward what they bring."""

    sends: tuple[ChunkTransfer, ...]
    """Transfers from this rank that start at this step: send the chunk as it is now."""


def rank_steps(transfers: Iterable[ChunkTransfer], rank: int) -> list[RankStep]:
    """One rank's part of a phase, step by step: what an executor on that rank runs. Receives may
    be posted as early as wanted; the plan only says when each must be complete."""
    receives: dict[int, list[ChunkTransfer]] = {}
    sends: dict[int, list[ChunkTransfer]] = {}
    for transfer in transfers:
        if transfer.dst == rank:
            receives.setdefault(transfer.end, []).append(transfer)
        if transfer.src == rank:
            sends.setdefault(transfer.step, []).append(transfer)
    return [
        RankStep(step, tuple(receives.get(step, ())), tuple(sends.get(step, ())))
        for step in sorted(receives.keys() | sends.keys())
    ]


def chunk_bounds(elements: int, chunks: int) -> list[tuple[int, int]]:
    """[start, stop) of each chunk of a buffer of `elements` elements: sizes differ by one at most."""
    size, extra = divmod(elements, chunks)
    bounds, start = [], 0
    for chunk in range(chunks):
        stop = start + size + (1 if chunk < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shifted(transfers: Sequence[ChunkTransfer], by: int) -> list[ChunkTransfer]:
    """The transfers, `by` steps later (to run one part of a phase after another)."""
    return [ChunkTransfer(t.step + by, t.src, t.dst, t.chunk, t.steps) for t in transfers]
