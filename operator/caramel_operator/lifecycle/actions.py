"""What a pass asks of the handlers: actions to carry out, reads to make, Events to post.

The reads are what `decide` cannot know from the pods and the status alone; the handler makes
them and calls `decide` again with what it read (Observed), which then decides from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from caramel_operator.gang_schedulers import GroupResource

# kopf cuts longer Event messages in the middle; the restart Event fits its own lines to it.
EVENT_MESSAGE_BYTES = 1024


@dataclass(frozen=True)
class CreateObject:
    """One of the job's own objects besides its pods: its headless Service, its NetworkPolicy."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class CreatePods:
    manifests: list[dict[str, Any]]


@dataclass(frozen=True)
class DeletePods:
    names: list[str]
    force: bool = False
    """Delete without a grace period: for pods whose node is gone, which would never finish terminating."""


@dataclass(frozen=True)
class CreateGroup:
    """Create the group object a gang scheduler admits the gang by (a Volcano PodGroup), owned by the job."""

    resource: GroupResource
    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeleteGroup:
    """Delete the group object of a gang that is gone: its scheduler would go on counting it."""

    resource: GroupResource
    name: str


Action = CreateObject | CreatePods | DeletePods | CreateGroup | DeleteGroup


@dataclass(frozen=True)
class ReadGroup:
    """Read the group object of a gang waiting for its gang scheduler's admission (Observed.group),
    and, where it is not there, whether the API server serves its resource at all."""

    resource: GroupResource
    name: str
    gang: int


@dataclass(frozen=True)
class PlaceGang:
    """Read the cluster's nodes and pods and place the current gang with R-Storm (Observed.placement)."""

    worker_pod: dict[str, Any]
    """Worker 0's pod as built: its requests, tolerations and node selection bind the placement."""

    min_workers: int
    """Place at least this many workers, or none."""

    replicas: int
    """Place at most this many (spec.workers.replicas): as many as fit up to here."""

    growing: bool = False
    """A look for room for a gang that runs short: what fits is room to grow, not the gang's placement."""


@dataclass(frozen=True)
class ReadProgress:
    """Scrape rank 0's metrics endpoint while the gang runs (Observed.progress and Observed.tuning)."""

    pod_ip: str
    port: int


Read = ReadGroup | PlaceGang | ReadProgress


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str
