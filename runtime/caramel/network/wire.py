"""A topology to and from its wire format (`caramel.contract.topology`), to hand a job's placed
topology to its workers; and the topology a worker runs on."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

from caramel.contract.env import WorkerContract
from caramel.contract.topology import WireTopology
from caramel.network.model import Link, Topology
from caramel.network.synthetic import racks

Value = TypeVar("Value", bound=Hashable)


def to_wire(topology: Topology) -> WireTopology:
    """The wire form of a topology."""
    speeds = _numbered((link.bandwidth, link.latency) for link in topology.links)
    groups = _numbered(topology.groups)
    return WireTopology(
        v=1,
        hosts=list(topology.hosts),
        switches=list(topology.switches),
        groups=[groups[group] for group in topology.groups],
        groupNames=list(groups),
        speeds=list(speeds),
        links=[
            (topology.index[link.a], topology.index[link.b], speeds[link.bandwidth, link.latency])
            for link in topology.links
        ],
    )


def _numbered(values: Iterable[Value]) -> dict[Value, int]:
    """Each distinct value and its number, in order of first appearance."""
    numbers: dict[Value, int] = {}
    for value in values:
        numbers.setdefault(value, len(numbers))
    return numbers


def from_wire(wire: WireTopology) -> Topology:
    """The topology of its wire form; ValueError where it is no valid topology (`Topology`'s checks)."""
    names = [*wire.hosts, *wire.switches]
    return Topology(
        hosts=tuple(wire.hosts),
        switches=tuple(wire.switches),
        links=tuple(Link(names[a], names[b], *wire.speeds[speed]) for a, b, speed in wire.links),
        groups=tuple(wire.groupNames[group] for group in wire.groups),
    )


def to_json(topology: Topology) -> str:
    """The compact JSON text of a topology."""
    return to_wire(topology).to_json()


def from_json(text: str) -> Topology:
    """The topology of a compact JSON text; a bad text raises ValueError naming the field."""
    return from_wire(WireTopology.parse(text))


def job_topology(contract: WorkerContract) -> Topology:
    """The network under a worker's job, one host per rank (CARAMEL_TOPOLOGY); a flat one (every
    rank on one switch) when the job has none. RuntimeError where the one given is no topology."""
    if contract.topology is None:
        # Only its shape matters (auto's choice and the trees compare routes over equal links).
        return racks(1, contract.world_size, bandwidth=1.0, uplink_bandwidth=1.0)
    try:
        return from_wire(contract.topology)
    except ValueError as error:
        raise RuntimeError(f"CARAMEL_TOPOLOGY: {error}") from None
