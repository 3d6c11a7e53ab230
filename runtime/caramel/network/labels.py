"""A cluster's topology from its Kubernetes node labels, and the topology of a placed gang.

Where a node is comes from its labels: its zone (`topology.kubernetes.io/zone`), its rack (a
label the operator is configured with, as clusters name racks differently) and its name
(`kubernetes.io/hostname`). The network is taken to be a hierarchy:

    worker --local-- node --node-- rack switch --rack-- zone switch --zone-- core

with one speed per level, from the operator's settings (`ClusterLinks`): `local` between the
workers on one node, `node` from a node to its rack's switch, `rack` the uplink a rack's nodes
share to their zone, `zone` the uplink a zone shares to the others. A node without a rack label
is taken to be alone in its rack (the cautious guess: it shares no switch with anyone); a node
without a zone label is in the zone "".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from caramel.network.model import Link, Topology
from caramel.network.spec import LinkSpec, SpecModel

ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_RACK_LABEL = "topology.caramel.dev/rack"


class ClusterLinks(SpecModel):
    """Speed of each level of a cluster's network (operator settings; JSON with camelCase keys)."""

    local: LinkSpec = LinkSpec(gbps=40, latency_us=5)
    """Between two workers on one node (through the node's loopback)."""

    node: LinkSpec = LinkSpec(gbps=25, latency_us=10)
    """From a node to its rack's switch."""

    rack: LinkSpec = LinkSpec(gbps=100, latency_us=10)
    """From a rack's switch to its zone: one uplink shared by the rack's nodes."""

    zone: LinkSpec = LinkSpec(gbps=100, latency_us=100)
    """From a zone to the others: one uplink shared by the zone's racks."""


@dataclass(frozen=True)
class Position:
    """Where a node is: its zone, its rack (unique across zones) and its own name."""

    zone: str
    rack: str
    node: str


def position(node: str, labels: Mapping[str, str], rack_label: str = DEFAULT_RACK_LABEL) -> Position:
    """A node's position from its labels."""
    zone = labels.get(ZONE_LABEL, "")
    name = labels.get(HOSTNAME_LABEL, node)
    rack = labels.get(rack_label)
    return Position(zone=zone, rack=f"{zone}/{rack}" if rack else f"{zone}/node:{name}", node=node)


def gang_topology(worker_positions: Sequence[Position], links: ClusterLinks = ClusterLinks()) -> Topology:
    """The topology of a gang whose worker i runs at `worker_positions[i]`; hosts are the
    workers "w0", "w1", ... in rank order, grouped by rack."""
    hosts = tuple(f"w{rank}" for rank in range(len(worker_positions)))
    nodes = {p.node: p for p in worker_positions}
    racks = {p.rack: p.zone for p in nodes.values()}
    zones = list(dict.fromkeys(racks.values()))
    switches = [f"node:{node}" for node in nodes] + [f"rack:{rack}" for rack in racks] + [f"zone:{zone}" for zone in zones]
    link_list = [Link(host, f"node:{p.node}", links.local.bandwidth, links.local.latency) for host, p in zip(hosts, worker_positions)]
    link_list += [Link(f"node:{node}", f"rack:{p.rack}", links.node.bandwidth, links.node.latency) for node, p in nodes.items()]
    link_list += [Link(f"rack:{rack}", f"zone:{zone}", links.rack.bandwidth, links.rack.latency) for rack, zone in racks.items()]
    if len(zones) > 1:
        switches.append("core")
        link_list += [Link(f"zone:{zone}", "core", links.zone.bandwidth, links.zone.latency) for zone in zones]
    return Topology(hosts, tuple(switches), tuple(link_list), tuple(p.rack for p in worker_positions))
