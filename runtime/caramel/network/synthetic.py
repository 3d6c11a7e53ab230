"""Standard synthetic topologies: 2D torus, 2D mesh, k-ary fat-tree, racks behind uplinks.

Hosts are listed in an order in which consecutive hosts are close, as placement orders ranks:
a ring over them in that order is the best ring the topology offers (on a torus or a mesh, a
boustrophedon through the rows; elsewhere, host by host within each switch).
"""

from __future__ import annotations

from collections.abc import Callable

from caramel.network.model import Link, Topology

GIGABIT = 1e9 / 8
"""Bytes per second in one Gbit/s."""
MICROSECOND = 1e-6


def _grid(rows: int, cols: int, bandwidth: float, latency: float, wrap: bool) -> Topology:
    if rows < 2 or cols < 2:
        raise ValueError(f"a grid needs at least 2 rows and 2 columns, got {rows}x{cols}")

    def name(row: int, col: int) -> str:
        return f"n{row}-{col}"

    links = []
    for row in range(rows):
        for col in range(cols):
            # A wrap-around link of a dimension of 2 would repeat the direct one.
            if col + 1 < cols or (wrap and cols > 2):
                links.append(Link(name(row, col), name(row, (col + 1) % cols), bandwidth, latency))
            if row + 1 < rows or (wrap and rows > 2):
                links.append(Link(name(row, col), name((row + 1) % rows, col), bandwidth, latency))
    snake = [(row, col if row % 2 == 0 else cols - 1 - col) for row in range(rows) for col in range(cols)]
    return Topology(
        hosts=tuple(name(row, col) for row, col in snake),
        switches=(),
        links=tuple(links),
        groups=tuple(f"row{row}" for row, _ in snake),
    )


def torus(rows: int, cols: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """A 2D torus of rows x cols hosts, each linked to its four neighbours (wrapping around)."""
    return _grid(rows, cols, bandwidth, latency, wrap=True)


def mesh(rows: int, cols: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """A 2D mesh of rows x cols hosts, each linked to its neighbours (no wrap-around)."""
    return _grid(rows, cols, bandwidth, latency, wrap=False)


def fat_tree(k: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """Al-Fares' k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 core
    switches and k^3/4 hosts, every link alike (full bisection bandwidth). A host's group is its
    edge switch."""
    if k < 2 or k % 2:
        raise ValueError(f"a fat-tree's k must be even and at least 2, got {k}")
    half = k // 2
    hosts: list[str] = []
    groups: list[str] = []
    switches: list[str] = []
    links: list[Link] = []
    cores = [f"core{i}-{j}" for i in range(half) for j in range(half)]
    switches += cores
    for pod in range(k):
        aggs = [f"agg{pod}-{i}" for i in range(half)]
        edges = [f"edge{pod}-{i}" for i in range(half)]
        switches += aggs + edges
        for i, agg in enumerate(aggs):
            links += [Link(agg, edge, bandwidth, latency) for edge in edges]
            links += [Link(agg, f"core{i}-{j}", bandwidth, latency) for j in range(half)]
        for edge in edges:
            for _ in range(half):
                host = f"h{len(hosts)}"
                hosts.append(host)
                groups.append(edge)
                links.append(Link(host, edge, bandwidth, latency))
    return Topology(tuple(hosts), tuple(switches), tuple(links), tuple(groups))


def racks(
    count: int,
    hosts_per_rack: int,
    bandwidth: float,
    uplink_bandwidth: float,
    latency: float = 0.0,
    uplink_latency: float | None = None,
) -> Topology:
    """`count` racks of hosts, each host linked to its rack's top-of-rack switch, and each of
    those linked by one uplink to a spine switch (hosts -> ToR -> uplink -> spine). An uplink
    slower than hosts_per_rack host links is oversubscribed."""
    if count < 1 or hosts_per_rack < 1:
        raise ValueError(f"need at least one rack and one host per rack, got {count} x {hosts_per_rack}")
    uplink_latency = latency if uplink_latency is None else uplink_latency
    hosts, groups, links = [], [], []
    tors = [f"tor{rack}" for rack in range(count)]
    for rack, tor in enumerate(tors):
        for slot in range(hosts_per_rack):
            host = f"r{rack}-h{slot}"
            hosts.append(host)
            groups.append(tor)
            links.append(Link(host, tor, bandwidth, latency))
    spine = ["spine"] if count > 1 else []
    links += [Link(tor, "spine", uplink_bandwidth, uplink_latency) for tor in tors if spine]
    return Topology(tuple(hosts), tuple(tors + spine), tuple(links), tuple(groups))


HOST_LINK = 100 * GIGABIT
HOP_LATENCY = 1 * MICROSECOND

STANDARD: dict[str, Callable[[], Topology]] = {
    "torus-4x4": lambda: torus(4, 4, HOST_LINK, HOP_LATENCY),
    "torus-8x8": lambda: torus(8, 8, HOST_LINK, HOP_LATENCY),
    "mesh-4x4": lambda: mesh(4, 4, HOST_LINK, HOP_LATENCY),
    "fat-tree-k4": lambda: fat_tree(4, HOST_LINK, HOP_LATENCY),
    # The testbed: racks joined by uplinks at 1/4 of a host link (8 hosts a rack: 32:1).
    "racks-2x8": lambda: racks(2, 8, HOST_LINK, HOST_LINK / 4, HOP_LATENCY),
    "racks-4x8": lambda: racks(4, 8, HOST_LINK, HOST_LINK / 4, HOP_LATENCY),
}
"""The topologies the simulator benchmark compares algorithms on, by name: 100 Gbit/s links
and 1 microsecond a hop."""
