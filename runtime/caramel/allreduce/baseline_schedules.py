"""The baseline all-reduce schedules: ring, recursive halving-doubling, and hierarchical.

Each is a function of the topology's host order (ranks) and, for the hierarchical one, of its
groups; none looks at links, which is what sets them apart from MULTITREE. All cut the buffer
into one chunk per host.
"""

from __future__ import annotations

from collections.abc import Sequence

from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule, shifted
from caramel.network.model import Topology


def _ring_reduce_scatter(members: Sequence[int], segments: Sequence[Sequence[int]]) -> list[ChunkTransfer]:
    """Ring reduce-scatter of len(members) segments: in step k member m sends segment m - k to
    member m + 1, so that member m ends owning segment m + 1, summed over all members."""
    size = len(members)
    return [
        ChunkTransfer(step, members[m], members[(m + 1) % size], chunk)
        for step in range(size - 1)
        for m in range(size)
        for chunk in segments[(m - step) % size]
    ]


def _ring_all_gather(members: Sequence[int], segments: Sequence[Sequence[int]]) -> list[ChunkTransfer]:
    """Ring all-gather from member m owning segment m + 1: in step k member m forwards segment m + 1 - k."""
    size = len(members)
    return [
        ChunkTransfer(step, members[m], members[(m + 1) % size], chunk)
        for step in range(size - 1)
        for m in range(size)
        for chunk in segments[(m + 1 - step) % size]
    ]


def ring(topology: Topology) -> Schedule:
    """Ring all-reduce over the ranks in order (Horovod's and Gloo's): 2(N - 1) steps of one chunk."""
    members, segments = range(topology.size), [[chunk] for chunk in range(topology.size)]
    return Schedule(
        "ring", topology.size, topology.size, tuple(_ring_reduce_scatter(members, segments)),
        tuple(_ring_all_gather(members, segments)),
    )


def halving_doubling(topology: Topology) -> Schedule:
    """Recursive halving-doubling (Rabenseifner): in reduce-scatter step k, ranks 2^k apart
    exchange half of what they still reduce; the all-gather retraces the steps backwards.

    With N not a power of two, the first N - 2^m odd ranks first hand their whole buffer to the
    even rank before them and get the result back at the end.
    """
    size = topology.size
    power = 1 << (size.bit_length() - 1)
    folded = size - power
    participants = [rank for rank in range(size) if not (rank < 2 * folded and rank % 2)]
    everything = range(size)
    reduce_scatter = [ChunkTransfer(0, 2 * i + 1, 2 * i, chunk) for i in range(folded) for chunk in everything]
    first = 1 if folded else 0
    ranges = [(0, size)] * power
    history = []
    for level in range(power.bit_length() - 1):
        bit, kept = 1 << level, []
        for virtual, (low, high) in enumerate(ranges):
            middle = (low + high) // 2
            keep, send = ((low, middle), (middle, high)) if not virtual & bit else ((middle, high), (low, middle))
            partner = participants[virtual ^ bit]
            reduce_scatter += [ChunkTransfer(first + level, participants[virtual], partner, c) for c in range(*send)]
            kept.append(keep)
        history.append(kept)
        ranges = kept
    all_gather = []
    levels = len(history)
    for back, level in enumerate(reversed(range(levels))):
        bit = 1 << level
        for virtual, (low, high) in enumerate(history[level]):
            partner = participants[virtual ^ bit]
            all_gather += [ChunkTransfer(back, participants[virtual], partner, c) for c in range(low, high)]
    all_gather += [ChunkTransfer(levels, 2 * i, 2 * i + 1, chunk) for i in range(folded) for chunk in everything]
    return Schedule("halving-doubling", size, size, tuple(reduce_scatter), tuple(all_gather))


def hierarchical(topology: Topology) -> Schedule:
    """Two-level all-reduce over the topology's groups (racks; torus rows), as NCCL's and
    Horovod's hierarchical modes do: a ring reduce-scatter within each group, then, for each
    position in a group, a ring reduce-scatter across the groups among the hosts at that
    position, on the part that position owns; the all-gather undoes both in reverse. Only a
    1/groupsize share of the data crosses between groups, over groupsize rings in parallel.

    Needs groups of equal size.
    """
    names = list(dict.fromkeys(topology.groups))
    members = [[host for host in range(topology.size) if topology.groups[host] == name] for name in names]
    width = len(members[0])
    if any(len(group) != width for group in members):
        sizes = ", ".join(f"{name}: {len(group)}" for name, group in zip(names, members))
        raise ValueError(f"the hierarchical all-reduce needs groups of equal size; got {sizes}")
    count = len(members)
    segments = [list(range(s * count, (s + 1) * count)) for s in range(width)]
    inner_rs = [t for group in members for t in _ring_reduce_scatter(group, segments)]
    inner_ag = [t for group in members for t in _ring_all_gather(group, segments)]
    outer_rs, outer_ag = [], []
    for position in range(width):
        across = [group[position] for group in members]
        owned = [[chunk] for chunk in segments[(position + 1) % width]]
        outer_rs += _ring_reduce_scatter(across, owned)
        outer_ag += _ring_all_gather(across, owned)
    return Schedule(
        "hierarchical", topology.size, topology.size,
        tuple(inner_rs + shifted(outer_rs, width - 1)),
        tuple(outer_ag + shifted(inner_ag, count - 1)),
    )
