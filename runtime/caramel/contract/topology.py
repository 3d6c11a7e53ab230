"""The network under a job as it travels to the workers (CARAMEL_TOPOLOGY): compact JSON.

    {"v": 1,
     "hosts": ["w0", "w1", "w2"],                    # rank order
     "switches": ["node:n1", "node:n2", "rack:a/r1"],
     "groups": [0, 0, 1], "groupNames": ["a/r1", "a/r2"],
     "speeds": [[3125000000.0, 2e-05], [40000000000.0, 5e-06]],   # [bytes/s, seconds]
     "links": [[0, 3, 1], [1, 3, 1], ...]}           # [node, node, speed]; nodes: hosts, then switches

Nodes are numbered hosts first, then switches, and each distinct link speed is written once, so
a cluster's topology costs about 10 bytes a link. Floats are written as Python's shortest
round-trip text. This is the format only; `caramel.network.wire` turns a `Topology` into it and
back (decoding gives back an equal Topology).
"""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from caramel.contract.jobfile import describe_validation_error


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

    @property
    def size(self) -> int:
        """Hosts: one per rank."""
        return len(self.hosts)

    @classmethod
    def parse(cls, text: str) -> WireTopology:
        """The topology of a JSON text; a bad text raises ValueError naming the field."""
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as error:
            raise ValueError("not a topology: " + "; ".join(describe_validation_error(error))) from None

    def to_json(self) -> str:
        return self.model_dump_json()

    def of_hosts(self, hosts: list[int]) -> WireTopology:
        """The network under some of the hosts, numbered anew in the order given (the ranks of a
        gang re-formed without some workers). In a switched network a host left out goes, with its
        links; in a direct one (no switches: the hosts forward each other's traffic) it stays as a
        node that only forwards, a switch, since the others' routes still cross it."""
        if len(set(hosts)) != len(hosts) or not all(0 <= host < len(self.hosts) for host in hosts):
            raise ValueError(f"hosts {hosts} are not distinct hosts of 0..{len(self.hosts) - 1}")
        left_out = [host for host in range(len(self.hosts)) if host not in hosts] if not self.switches else []
        switches = [self.hosts[host] for host in left_out] + self.switches
        node = {old: new for new, old in enumerate([*hosts, *left_out])}
        node.update({len(self.hosts) + number: len(hosts) + len(left_out) + number for number in range(len(self.switches))})
        return WireTopology(
            v=1,
            hosts=[self.hosts[host] for host in hosts],
            switches=switches,
            groups=[self.groups[host] for host in hosts] if self.groups else [],
            groupNames=self.groupNames,
            speeds=self.speeds,
            links=[(node[a], node[b], speed) for a, b, speed in self.links if a in node and b in node],
        )
