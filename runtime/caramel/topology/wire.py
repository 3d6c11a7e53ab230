"""A topology as compact JSON, to hand a job's placed topology to its workers.

    {"v": 1,
     "hosts": ["w0", "w1", "w2"],                    # rank order
     "switches": ["node:n1", "node:n2", "rack:a/r1"],
     "groups": [0, 0, 1], "groupNames": ["a/r1", "a/r2"],
     "speeds": [[3125000000.0, 2e-05], [40000000000.0, 5e-06]],   # [bytes/s, seconds]
     "links": [[0, 3, 1], [1, 3, 1], ...]}           # [node, node, speed]; nodes: hosts, then switches

Nodes are numbered hosts first, then switches, and each distinct link speed is written once, so
a cluster's topology costs about 10 bytes a link. Floats are written as Python's shortest
round-trip text, so decoding gives back an equal Topology.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from caramel.job.jobfile import describe_validation_error
from caramel.topology.model import Link, Topology


class WireTopology(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1]
    hosts: list[str] = Field(min_length=1)
    switches: list[str]
    groups: list[int]
    groupNames: list[str]  # noqa: N815 (the wire's own spelling)
    speeds: list[tuple[float, float]]
    links: list[tuple[int, int, int]]

    @pydantic.model_validator(mode="after")
    def _in_range(self) -> WireTopology:
        nodes = len(self.hosts) + len(self.switches)
        for number, (a, b, speed) in enumerate(self.links):
            if not (0 <= a < nodes and 0 <= b < nodes):
                raise ValueError(f"links[{number}]: node numbers must be within 0..{nodes - 1}")
            if not 0 <= speed < len(self.speeds):
                raise ValueError(f"links[{number}]: speed must be within 0..{len(self.speeds) - 1}")
        if any(not 0 <= group < len(self.groupNames) for group in self.groups):
            raise ValueError(f"groups: every group must be within 0..{len(self.groupNames) - 1}")
        return self


def to_json(topology: Topology) -> str:
    """The compact JSON text of a topology."""
    speeds = _numbered((link.bandwidth, link.latency) for link in topology.links)
    groups = _numbered(topology.groups)
    wire = WireTopology(
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
    return wire.model_dump_json()


def _numbered(values: Iterable[Hashable]) -> dict:
    """Each distinct value and its number, in order of first appearance."""
    numbers: dict = {}
    for value in values:
        numbers.setdefault(value, len(numbers))
    return numbers


def from_json(text: str) -> Topology:
    """The topology of a compact JSON text; a bad text raises ValueError naming the field."""
    try:
        wire = WireTopology.model_validate_json(text)
    except pydantic.ValidationError as error:
        raise ValueError("not a topology: " + "; ".join(describe_validation_error(error))) from None
    names = [*wire.hosts, *wire.switches]
    return Topology(
        hosts=tuple(wire.hosts),
        switches=tuple(wire.switches),
        links=tuple(Link(names[a], names[b], *wire.speeds[speed]) for a, b, speed in wire.links),
        groups=tuple(wire.groupNames[group] for group in wire.groups),
    )
