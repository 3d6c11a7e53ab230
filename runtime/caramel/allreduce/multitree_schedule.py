"""MULTITREE all-reduce (Huang et al., ISCA 2021): one spanning tree per root, built together.

Construction, as the paper's algorithm does it. Every host roots a tree, which is responsible
for one chunk (1/N of the buffer). The trees grow together, top-down, in time steps. At the
start of a step every link is free. The trees then take turns, round-robin by root; in its turn
a tree adds at most one child: the first of its hosts (in the order they joined it) that
already holds the tree's data and has a free link to a host not yet in the tree takes such a
host as its child, over that link, which is then used for the step. The step ends when a whole
round adds no child. So no two trees use a link in the same time step, and their transfers
never contend.

Switches. As the paper does for switch-based networks, a tree edge joins two hosts over their
route through switches (`Topology.hop_route`; hosts do not forward), and every link on the
route must be free: two trees cannot share a host's link to its switch, nor an uplink between
switches, in one step. In a direct network (torus, mesh) a host's children are its neighbours,
one link away.

Which child. A host joins a tree only through one of the tree's members nearest to it (in time
steps, then in hops): a farther member would take a detour over links the nearer one does not
need, so a tree crosses into a rack once, and its members there spread it within the rack.
Among the hosts a parent may take, it takes the farthest first, so that the transfers over slow
links, which every tree needs, start as early as they can and keep the bottleneck busy. On a
direct network every candidate is a neighbour one hop away, and the construction is the
paper's (ties go to the lowest rank). The authors' code for switched networks tries the hosts on
the parent's own switch first; on racks behind an oversubscribed uplink that leaves the uplink
idle in the first steps and lets trees cross it several times: 75 time steps instead of 39 on
two racks of 8 hosts with an uplink at 1/4 of a host link.

Links of other speeds (a generalisation of the paper, which assumes equal links). The time unit
is one chunk over the fastest route between two neighbouring hosts. A route with a slower
bottleneck carries its chunk over `steps` = ceil(unit bandwidth / bottleneck) steps, at 1/steps
of the unit rate, and takes that share of every link on it for those steps; a link is free for
a transfer while the shares already taken leave room for it. A link k times faster than the unit
thus carries k trees in a step, and a host's link is not blocked for the whole of a slow
transfer across an oversubscribed uplink. With equal links this is exactly the paper's rule.

Schedule. All-gather: a tree edge added in step t with duration d has the parent send the
finished chunk to the child during [t, t + d). Reduce-scatter runs the same edges mirrored in
time, child to parent during [T - t - d, T - t), T being the all-gather's length: a host's
children joined after it, so their edges end later in the all-gather, hence earlier in the
mirror, and a host sends its partial sum up only once its whole subtree's has arrived. The
mirror keeps every link's use within its capacity in every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule, phase_steps
from caramel.network.model import Topology

# Shares of a link within this much of its capacity fit (sums of thirds, sevenths, ...).
CAPACITY_SLACK = 1e-9
UNREACHABLE = np.iinfo(np.int32).max


@dataclass(frozen=True)
class TreeEdge:
    """A parent that sends tree `root`'s chunk to a child during time steps [step, step + steps)."""

    root: int
    parent: int
    child: int
    step: int
    steps: int


@dataclass(frozen=True)
class _Routes:
    """Every host pair's route as arrays, padded with a dummy link of endless capacity."""

    links: np.ndarray
    """[src, dst, hop]: directed link numbers, the dummy (number L) past the route's end."""
    shares: np.ndarray
    """[src, dst, hop]: share of each link's capacity the pair's transfer takes (0 on the dummy)."""
    steps: np.ndarray
    """[src, dst]: time steps the pair's transfer lasts."""
    cost: np.ndarray
    """[src, dst]: how far dst is from src, in steps then hops (UNREACHABLE: not over switches only)."""


def _routes(topology: Topology) -> _Routes:
    """The routes a tree edge may take, their durations and their shares of each link."""
    size, dummy = topology.size, len(topology.bandwidth)
    pairs = {
        (src, dst): route
        for src in range(size)
        for dst in range(size)
        if src != dst and (route := topology.hop_route(src, dst)) is not None
    }
    bottleneck = {pair: float(topology.bandwidth[list(route)].min()) for pair, route in pairs.items()}
    unit = max(bottleneck.values(), default=1.0)
    hops = max((len(route) for route in pairs.values()), default=1)
    links = np.full((size, size, hops), dummy, dtype=np.int64)
    shares = np.zeros((size, size, hops))
    steps = np.ones((size, size), dtype=np.int64)
    cost = np.full((size, size), UNREACHABLE, dtype=np.int64)
    for (src, dst), route in pairs.items():
        duration = max(1, math.ceil(unit / bottleneck[src, dst] - CAPACITY_SLACK))
        links[src, dst, : len(route)] = route
        shares[src, dst, : len(route)] = (unit / duration) / topology.bandwidth[list(route)]
        steps[src, dst] = duration
        cost[src, dst] = duration * (hops + 1) + len(route)
    return _Routes(links, shares, steps, cost)


class _Occupancy:
    """Share of each directed link's capacity taken in each time step."""

    def __init__(self, links: int) -> None:
        self.taken = np.zeros((16, links + 1))

    def headroom(self, step: int, durations: np.ndarray, links: np.ndarray | slice = slice(None)) -> np.ndarray:
        """[i, link]: capacity left on the links through steps [step, step + durations[i])."""
        self._reach(step + int(durations.max()))
        return np.stack([1.0 - self.taken[step : step + d, links].max(axis=0) for d in durations])

    def take(self, step: int, steps: int, links: np.ndarray, shares: np.ndarray) -> None:
        self._reach(step + steps)
        self.taken[step : step + steps, links] += shares
        self.taken[:, -1] = 0.0  # the dummy link past a route's end never fills

    def _reach(self, step: int) -> None:
        if step > len(self.taken):
            grown = np.zeros((max(step, 2 * len(self.taken)), self.taken.shape[1]))
            grown[: len(self.taken)] = self.taken
            self.taken = grown


def build_trees(topology: Topology) -> list[list[TreeEdge]]:
    """One spanning tree per root (host), edges in the order they were added."""
    forest = _Forest(topology)
    step = 0
    while not forest.spanning():
        forest.grow(step)
        step += 1
    return forest.trees


class _Forest:
    """The trees under construction, and the links' use step by step."""

    def __init__(self, topology: Topology) -> None:
        size = self.size = topology.size
        self.routes = _routes(topology)
        self.durations = np.unique(self.routes.steps)  # sorted: row 0 is one step
        self.duration_row = np.searchsorted(self.durations, self.routes.steps)
        self.occupancy = _Occupancy(len(topology.bandwidth))
        self.members = [np.array([root]) for root in range(size)]  # in the order they joined
        self.joined = np.eye(size, dtype=bool)
        # [root, host]: the step from which the host holds the root's chunk.
        self.ready = np.where(self.joined, 0, UNREACHABLE)
        # [root, host]: the host's distance from the nearest member of the root's tree.
        self.closest = self.routes.cost.copy()
        self.trees: list[list[TreeEdge]] = [[] for _ in range(size)]
        outgoing = [[topology.link_numbers[host, node] for node in topology.graph[host]] for host in range(size)]
        incoming = [[topology.link_numbers[node, host] for node in topology.graph[host]] for host in range(size)]
        self.egress, self.egress_starts = _flatten(outgoing)
        self.ingress, self.ingress_starts = _flatten(incoming)

    def spanning(self) -> bool:
        return bool(self.joined.all())

    def grow(self, step: int) -> None:
        """One time step: rounds of turns until a round adds no child. (Construction ends: in a
        step with nothing in flight every link is free, and a connected network always leaves a
        tree some host it can reach.)"""
        self._measure(step)
        waiting = [root for root in range(self.size) if not self.joined[root].all()]
        while waiting:
            # A tree that found no child keeps finding none in this step: links only fill up.
            waiting = [root for root in waiting if self._turn(root, step)]

    def _measure(self, step: int) -> None:
        self.headroom = self.occupancy.headroom(step, self.durations)
        self._measure_hosts()

    def _measure_hosts(self) -> None:
        now = self.headroom[0]
        self.can_send = np.maximum.reduceat(now[self.egress], self.egress_starts) > CAPACITY_SLACK
        self.can_receive = np.maximum.reduceat(now[self.ingress], self.ingress_starts) > CAPACITY_SLACK

    def _turn(self, root: int, step: int) -> bool:
        """Tree `root` adds a child if it can; False if it cannot (or is complete)."""
        missing = np.flatnonzero(~self.joined[root] & self.can_receive)
        members = self.members[root]
        parents = members[(self.ready[root, members] <= step) & self.can_send[members]]
        if not len(missing) or not len(parents):
            return False
        routes = self.routes
        cost = routes.cost[parents[:, None], missing]
        # Only the tree's nearest members may take a host: a farther one would make a detour.
        rows, columns = np.nonzero((cost == self.closest[root, missing]) & (cost < UNREACHABLE))
        src, dst = parents[rows], missing[columns]
        fits = (
            self.headroom[self.duration_row[src, dst][:, None], routes.links[src, dst]] + CAPACITY_SLACK
            >= routes.shares[src, dst]
        ).all(axis=1)
        if not fits.any():
            return False
        # The first parent (in joining order) that can take a child takes its farthest one.
        first = rows[fits].min()
        mine = fits & (rows == first)
        pick = np.flatnonzero(mine)[np.argmax(cost[first, columns[mine]])]
        self._add(root, int(src[pick]), int(dst[pick]), step)
        return True

    def _add(self, root: int, parent: int, child: int, step: int) -> None:
        steps = int(self.routes.steps[parent, child])
        self.occupancy.take(step, steps, self.routes.links[parent, child], self.routes.shares[parent, child])
        self.trees[root].append(TreeEdge(root, parent, child, step, steps))
        self.members[root] = np.append(self.members[root], child)
        self.joined[root, child] = True
        self.ready[root, child] = step + steps
        np.minimum(self.closest[root], self.routes.cost[child], out=self.closest[root])
        links = self.routes.links[parent, child]
        self.headroom[:, links] = self.occupancy.headroom(step, self.durations, links)
        self._measure_hosts()


def _flatten(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated lists and where each starts (for np.maximum.reduceat)."""
    starts = np.cumsum([0] + [len(items) for items in lists[:-1]])
    return np.array([item for items in lists for item in items]), starts


def schedule_from_trees(size: int, trees: list[list[TreeEdge]]) -> Schedule:
    """The reduce-scatter and all-gather of a set of trees (see the module's docstring)."""
    edges = [edge for tree in trees for edge in tree]
    all_gather = tuple(ChunkTransfer(e.step, e.parent, e.child, e.root, e.steps) for e in edges)
    length = phase_steps(all_gather)
    reduce_scatter = tuple(ChunkTransfer(length - e.step - e.steps, e.child, e.parent, e.root, e.steps) for e in edges)
    return Schedule("multitree", size, size, reduce_scatter, all_gather)


@lru_cache(maxsize=32)
def multitree(topology: Topology) -> Schedule:
    """MULTITREE's all-reduce schedule on a topology; chunk r travels on the tree rooted at rank r."""
    return schedule_from_trees(topology.size, build_trees(topology))
