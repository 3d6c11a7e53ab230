"""The network under a job: hosts, switches, and the full-duplex links between them.

Hosts are where workers run, listed in rank order: host i is rank i. Switches only forward.
A network without switches is a direct network (a torus, a mesh): its hosts are also its
routers, and traffic between two hosts may pass through others. In a network with switches,
traffic passes through switches only; a host reaches another host directly only over a link
between the two.

Every link is full duplex: each direction has the link's whole bandwidth. Directed link 2i is
link i from `a` to `b`, and 2i + 1 from `b` to `a`.

Routes are shortest paths in hops. Where there are several, a pair's route is chosen among them
by a fixed function of the pair, as ECMP hashing does, so that every process derives the same
route and the traffic of different pairs spreads over the equal paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import networkx as nx
import numpy as np


@dataclass(frozen=True)
class Link:
    """A full-duplex link between two nodes (hosts or switches), named by the nodes' names."""

    a: str
    b: str
    bandwidth: float
    """Bytes per second, in each direction."""

    latency: float = 0.0
    """Seconds for a message to cross the link (propagation, switching and per-message costs)."""


@dataclass(frozen=True)
class Topology:
    """Hosts in rank order, switches, links, and each host's group (its rack; a torus row).

    Groups are what a hierarchical all-reduce reduces within before it crosses between them.
    Left empty, a host's group is the first switch it is linked to (its top-of-rack switch),
    or one group for all hosts of a direct network.
    """

    hosts: tuple[str, ...]
    switches: tuple[str, ...]
    links: tuple[Link, ...]
    groups: tuple[str, ...] = ()
    # Caches, filled as routes are asked for.
    _routes: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _searches: dict[int, tuple[dict[int, list[int]], dict[int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        names = [*self.hosts, *self.switches]
        if not self.hosts:
            raise ValueError("hosts: a topology needs at least one host")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique; repeated: {', '.join(duplicates)}")
        known, pairs = set(names), set()
        for number, link in enumerate(self.links):
            where = f"links[{number}] ({link.a} - {link.b})"
            for end in (link.a, link.b):
                if end not in known:
                    raise ValueError(f"{where}: unknown node {end!r}")
            if link.a == link.b:
                raise ValueError(f"{where}: a link joins two different nodes")
            if not (link.bandwidth > 0 and math.isfinite(link.bandwidth)):
                raise ValueError(f"{where}: bandwidth must be a positive number of bytes per second")
            if not (link.latency >= 0 and math.isfinite(link.latency)):
                raise ValueError(f"{where}: latency must be zero or more seconds")
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise ValueError(f"{where}: two links join the same nodes; give one link their total bandwidth")
            pairs.add(pair)
        if self.groups and len(self.groups) != len(self.hosts):
            raise ValueError(f"groups: expected one group per host ({len(self.hosts)}), got {len(self.groups)}")
        if len(names) > 1 and not nx.is_connected(self.graph):
            raise ValueError("links: the network is not connected; every host must reach every other")
        if not self.groups:
            object.__setattr__(self, "groups", self._attachment_groups())

    def _attachment_groups(self) -> tuple[str, ...]:
        first_switch: dict[str, str] = {}
        for link in self.links:
            for host, other in ((link.a, link.b), (link.b, link.a)):
                if other in self.switches:
                    first_switch.setdefault(host, other)
        return tuple(first_switch.get(host, "") for host in self.hosts)

    @property
    def size(self) -> int:
        """Number of hosts."""
        return len(self.hosts)

    @property
    def direct(self) -> bool:
        """True for a direct network (no switches), whose hosts forward traffic."""
        return not self.switches

    @cached_property
    def index(self) -> dict[str, int]:
        """Node number of each name: hosts first, in rank order, then switches."""
        return {name: number for number, name in enumerate((*self.hosts, *self.switches))}

    @cached_property
    def graph(self) -> nx.Graph[int]:
        graph: nx.Graph[int] = nx.Graph()
        graph.add_nodes_from(range(len(self.hosts) + len(self.switches)))
        graph.add_edges_from((self.index[link.a], self.index[link.b]) for link in self.links)
        return graph

    @cached_property
    def bandwidth(self) -> np.ndarray:
        """Bytes per second of each directed link."""
        return np.repeat([link.bandwidth for link in self.links], 2).astype(np.float64)

    @cached_property
    def latency(self) -> np.ndarray:
        """Seconds of each directed link."""
        return np.repeat([link.latency for link in self.links], 2).astype(np.float64)

    @cached_property
    def link_numbers(self) -> dict[tuple[int, int], int]:
        """The directed link number of each (from node, to node) pair of linked nodes."""
        numbers = {}
        for number, link in enumerate(self.links):
            a, b = self.index[link.a], self.index[link.b]
            numbers[a, b], numbers[b, a] = 2 * number, 2 * number + 1
        return numbers

    @cached_property
    def _switch_graph(self) -> nx.Graph[int]:
        # A copy, not a view: paths are searched in it for many pairs.
        return nx.Graph(self.graph.subgraph(range(len(self.hosts), len(self.hosts) + len(self.switches))))

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Directed links from host `src` to host `dst`, in order."""
        key = (src, dst)
        if key not in self._routes:
            paths = self._shortest_paths(src, dst)
            if not paths:
                raise ValueError(f"no route from {self.hosts[src]} to {self.hosts[dst]} through switches")
            path = paths[_ecmp_choice(src, dst, len(paths))]
            self._routes[key] = tuple(self.link_numbers[hop] for hop in zip(path, path[1:]))
        return self._routes[key]

    def hop_route(self, src: int, dst: int) -> tuple[int, ...] | None:
        """The route from `src` to `dst` if no other host is on it, else None.

        In a switched network that is every route; in a direct network, only a neighbour's.
        """
        if self.direct and not self.graph.has_edge(src, dst):
            return None
        return self.route(src, dst)

    def route_latency(self, route: tuple[int, ...]) -> float:
        """Seconds a message takes to cross the route, bandwidth aside."""
        return sum(self._link_latencies[link] for link in route)

    @cached_property
    def _link_latencies(self) -> list[float]:
        latencies: list[float] = self.latency.tolist()
        return latencies

    def _shortest_paths(self, src: int, dst: int) -> list[list[int]]:
        if self.graph.has_edge(src, dst):
            return [[src, dst]]
        if self.direct:
            return sorted(nx.all_shortest_paths(self.graph, src, dst))
        hosts = len(self.hosts)
        firsts = [node for node in self.graph[src] if node >= hosts]
        lasts = [node for node in self.graph[dst] if node >= hosts]
        hops = {(a, b): self._switch_search(a)[1].get(b, math.inf) for a in firsts for b in lasts}
        fewest = min(hops.values(), default=math.inf)
        if fewest == math.inf:
            return []
        paths = []
        for (a, b), count in sorted(hops.items()):
            if count == fewest:
                paths += [[src, *middle, dst] for middle in _paths_back(self._switch_search(a)[0], b)]
        return sorted(paths)

    def _switch_search(self, source: int) -> tuple[dict[int, list[int]], dict[int, int]]:
        """A breadth-first search of the switches from switch `source`, done once: each switch's
        predecessors on the shortest paths from it, and its distance in hops."""
        if source not in self._searches:
            # networkx's stubs do not narrow its result by its arguments: with return_seen and no
            # target, it is the pair (predecessors, distances).
            self._searches[source] = cast(
                tuple[dict[int, list[int]], dict[int, int]], nx.predecessor(self._switch_graph, source, return_seen=True)
            )
        return self._searches[source]


def _paths_back(predecessors: dict[int, list[int]], target: int) -> list[list[int]]:
    """Every shortest path to `target` given the predecessors of a breadth-first search."""
    if not predecessors[target]:
        return [[target]]
    return [[*path, target] for before in predecessors[target] for path in _paths_back(predecessors, before)]


def _ecmp_choice(src: int, dst: int, choices: int) -> int:
    """Which of `choices` equal paths a pair takes: a fixed multiplicative hash of the pair."""
    return ((src * 2654435761) ^ (dst * 40503)) % choices
