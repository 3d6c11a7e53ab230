"""Topology files: a small YAML (or JSON) format for local runs and benchmarks.

One document, whose `kind` says which of these it is. Bandwidths are in Gbit/s (`gbps`, each
direction of a full-duplex link) and latencies in microseconds (`latencyUs`, default 0):

    kind: torus            # also: mesh; rows x cols hosts, each linked to its neighbours
    rows: 4
    cols: 4
    link: {gbps: 100, latencyUs: 1}

    kind: fatTree          # Al-Fares' k-ary fat-tree, k^3/4 hosts
    k: 4
    link: {gbps: 100}

    kind: racks            # hosts -> top-of-rack switch -> uplink -> spine
    racks: 2
    hostsPerRack: 8
    link: {gbps: 100}      # each host to its top-of-rack switch
    uplink: {gbps: 25}     # each top-of-rack switch to the spine

    kind: graph            # any network
    hosts:                 # in rank order; group: its rack (optional)
      - {name: a, group: left}
      - {name: b, group: right}
    switches: [s]
    links:
      - {between: [a, s], gbps: 10, latencyUs: 5}
      - {between: [b, s], gbps: 10, latencyUs: 5}

Every problem is reported with the path of the field at fault, e.g. `links[1].gbps`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from caramel.contract.jobfile import describe_validation_error
from caramel.network import synthetic
from caramel.network.model import Link, Topology
from caramel.network.synthetic import GIGABIT, MICROSECOND


class TopologySpecError(ValueError):
    """A topology file or document that is not valid; the message names every field at fault."""


class SpecModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class LinkSpec(SpecModel):
    """Speed of a link: bandwidth in each direction and latency."""

    gbps: float = Field(gt=0, allow_inf_nan=False)
    latency_us: float = Field(0.0, ge=0, allow_inf_nan=False)

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.gbps * GIGABIT

    @property
    def latency(self) -> float:
        """Seconds."""
        return self.latency_us * MICROSECOND


class GridSpec(SpecModel):
    """A 2D torus (neighbours wrap around) or mesh (they do not)."""

    kind: Literal["torus", "mesh"]
    rows: int = Field(ge=2, le=64)
    cols: int = Field(ge=2, le=64)
    link: LinkSpec

    def build(self) -> Topology:
        grid = synthetic.torus if self.kind == "torus" else synthetic.mesh
        return grid(self.rows, self.cols, self.link.bandwidth, self.link.latency)


class FatTreeSpec(SpecModel):
    kind: Literal["fatTree"]
    k: int = Field(ge=2, le=32, multiple_of=2)
    link: LinkSpec

    def build(self) -> Topology:
        return synthetic.fat_tree(self.k, self.link.bandwidth, self.link.latency)


class RacksSpec(SpecModel):
    kind: Literal["racks"]
    racks: int = Field(ge=1, le=1024)
    hosts_per_rack: int = Field(ge=1, le=1024)
    link: LinkSpec
    uplink: LinkSpec

    def build(self) -> Topology:
        return synthetic.racks(
            self.racks, self.hosts_per_rack, self.link.bandwidth, self.uplink.bandwidth,
            self.link.latency, self.uplink.latency,
        )


class HostSpec(SpecModel):
    name: str = Field(min_length=1)
    group: str | None = None


class GraphLinkSpec(LinkSpec):
    between: tuple[str, str]


class GraphSpec(SpecModel):
    kind: Literal["graph"]
    hosts: list[HostSpec] = Field(min_length=1)
    switches: list[str] = []
    links: list[GraphLinkSpec] = []

    @pydantic.model_validator(mode="after")
    def _connects(self) -> GraphSpec:
        self.build()  # a link to an unknown node, a disconnected network, ...: named by Topology
        return self

    def build(self) -> Topology:
        groups = [host.group for host in self.hosts if host.group is not None]
        if groups and len(groups) != len(self.hosts):
            missing = next(i for i, host in enumerate(self.hosts) if host.group is None)
            raise ValueError(f"hosts[{missing}].group: give every host a group, or none")
        return Topology(
            hosts=tuple(host.name for host in self.hosts),
            switches=tuple(self.switches),
            links=tuple(Link(*link.between, link.bandwidth, link.latency) for link in self.links),
            groups=tuple(groups),
        )


KINDS: dict[str, type[GridSpec | FatTreeSpec | RacksSpec | GraphSpec]] = {
    "torus": GridSpec, "mesh": GridSpec, "fatTree": FatTreeSpec, "racks": RacksSpec, "graph": GraphSpec,
}


def parse_topology(document: Any, source: str = "topology") -> Topology:
    """The topology a parsed YAML/JSON document describes."""
    kind = document.get("kind") if isinstance(document, dict) else None
    if kind not in KINDS:
        raise _invalid(source, [f"kind: must be one of {', '.join(KINDS)} (got {kind!r})"])
    try:
        return KINDS[kind].model_validate(document).build()
    except pydantic.ValidationError as error:
        raise _invalid(source, describe_validation_error(error)) from None


def _invalid(source: str, problems: list[str]) -> TopologySpecError:
    return TopologySpecError(f"{source} is not a valid topology:\n" + "\n".join(f"  {line}" for line in problems))


def load_topology(path: str | Path) -> Topology:
    """The topology of a YAML or JSON file."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise TopologySpecError(f"cannot read topology file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise TopologySpecError(f"{path} is not valid YAML: {error}") from None
    return parse_topology(document, source=str(path))
