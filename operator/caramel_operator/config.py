"""The operator's own settings, read once from its environment."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pydantic

from caramel.job.contract import RENDEZVOUS_TIMEOUT_SECONDS
from caramel.job.jobfile import describe_validation_error
from caramel.topology.labels import DEFAULT_RACK_LABEL, ClusterLinks

# A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of at most 63
# alphanumerics, '-', '_' and '.', alphanumeric at both ends.
LABEL_KEY_PATTERN = re.compile(
    r"^(?:(?=.{1,253}/)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"(?=.{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class SettingsError(ValueError):
    """An operator environment variable with a bad value; the message names it."""


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = "caramel:0.1.0"
    """Image of jobs that name no spec.image (CARAMEL_RUNTIME_IMAGE)."""

    watch_namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches the whole cluster (CARAMEL_WATCH_NAMESPACES, comma-separated)."""

    metrics_port: int = 8000
    """Port of the operator's own /metrics (CARAMEL_OPERATOR_METRICS_PORT)."""

    health_port: int = 8080
    """Port of the liveness endpoint /healthz (CARAMEL_OPERATOR_HEALTH_PORT). The readiness
    endpoint /readyz is on the metrics port."""

    api_request_timeout_seconds: float = 10.0
    """Longest wait for the answer to one Kubernetes API request of the operator's, its own and
    kopf's (CARAMEL_API_REQUEST_TIMEOUT_SECONDS); watches have their own, longer timeouts."""

    api_connect_timeout_seconds: float = 5.0
    """Longest wait for a connection to the Kubernetes API server (CARAMEL_API_CONNECT_TIMEOUT_SECONDS)."""

    watch_stall_seconds: float = 60.0
    """How long a change to a CaramelJob may go undelivered by the operator's watch before its
    liveness probe fails and the kubelet restarts it (CARAMEL_WATCH_STALL_SECONDS)."""

    reconcile_interval_seconds: float = 2.0
    """Seconds between two reconciliations of a job (CARAMEL_RECONCILE_INTERVAL_SECONDS)."""

    restart_backoff_seconds: float = 10.0
    """Wait before the first gang restart, doubled at each further one (CARAMEL_RESTART_BACKOFF_SECONDS)."""

    restart_backoff_max_seconds: float = 300.0
    """Longest wait before a gang restart (CARAMEL_RESTART_BACKOFF_MAX_SECONDS)."""

    gang_scheduling_timeout_seconds: float = 300.0
    """How long part of a gang may hold its nodes while the rest is unschedulable before the whole
    gang is released and retried with backoff, or runs with the scheduled part where
    spec.workers.minReplicas allows it (CARAMEL_GANG_SCHEDULING_TIMEOUT_SECONDS). Also how long a
    gang R-Storm cannot place whole waits before fewer workers are placed, and how often a gang
    running short looks for room to grow: one patience for room, whichever way it goes."""

    network_policy: bool = True
    """Give every job a NetworkPolicy that admits only its own pods, the operator and the
    monitoring namespace (CARAMEL_NETWORK_POLICY: true or false)."""

    monitoring_namespace: str = "monitoring"
    """Namespace whose pods may scrape the workers' metrics; empty for none (CARAMEL_MONITORING_NAMESPACE)."""

    operator_namespace: str = ""
    """The operator's own namespace, from the downward API; empty admits operator pods of any
    namespace to the workers' metrics (CARAMEL_OPERATOR_NAMESPACE)."""

    rack_label: str = DEFAULT_RACK_LABEL
    """The node label that names a node's rack, for placement and the placed topology
    (CARAMEL_TOPOLOGY_RACK_LABEL)."""

    links: ClusterLinks = field(default_factory=ClusterLinks)
    """Speed of each level of the cluster's network, for the placed topology
    (CARAMEL_TOPOLOGY_LINKS: JSON such as {"rack": {"gbps": 25, "latencyUs": 10}}; levels local,
    node, rack and zone, each left out keeps its default)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> OperatorSettings:
        def number(name: str, default: float, kind: type = float) -> float:
            text = environ.get(name)
            if not text:
                return default
            try:
                value = kind(text)
            except ValueError:
                expected = "a whole number" if kind is int else "a number"
                raise SettingsError(f"{name}: expected {expected}, got {text!r}") from None
            if value <= 0:
                raise SettingsError(f"{name}: must be positive, got {text!r}")
            return value

        namespaces = tuple(ns.strip() for ns in environ.get("CARAMEL_WATCH_NAMESPACES", "").split(",") if ns.strip())
        policy = environ.get("CARAMEL_NETWORK_POLICY", "true").strip().lower()
        if policy not in ("true", "false"):
            raise SettingsError(f"CARAMEL_NETWORK_POLICY: expected true or false, got {policy!r}")
        return cls(
            runtime_image=environ.get("CARAMEL_RUNTIME_IMAGE") or cls.runtime_image,
            watch_namespaces=namespaces,
            metrics_port=int(number("CARAMEL_OPERATOR_METRICS_PORT", cls.metrics_port, int)),
            health_port=int(number("CARAMEL_OPERATOR_HEALTH_PORT", cls.health_port, int)),
            api_request_timeout_seconds=number("CARAMEL_API_REQUEST_TIMEOUT_SECONDS", cls.api_request_timeout_seconds),
            api_connect_timeout_seconds=number("CARAMEL_API_CONNECT_TIMEOUT_SECONDS", cls.api_connect_timeout_seconds),
            watch_stall_seconds=number("CARAMEL_WATCH_STALL_SECONDS", cls.watch_stall_seconds),
            reconcile_interval_seconds=number("CARAMEL_RECONCILE_INTERVAL_SECONDS", cls.reconcile_interval_seconds),
            restart_backoff_seconds=number("CARAMEL_RESTART_BACKOFF_SECONDS", cls.restart_backoff_seconds),
            restart_backoff_max_seconds=number("CARAMEL_RESTART_BACKOFF_MAX_SECONDS", cls.restart_backoff_max_seconds),
            gang_scheduling_timeout_seconds=number(
                "CARAMEL_GANG_SCHEDULING_TIMEOUT_SECONDS", cls.gang_scheduling_timeout_seconds
            ),
            network_policy=policy == "true",
            monitoring_namespace=environ.get("CARAMEL_MONITORING_NAMESPACE", cls.monitoring_namespace).strip(),
            operator_namespace=environ.get("CARAMEL_OPERATOR_NAMESPACE", "").strip(),
            rack_label=_rack_label(environ.get("CARAMEL_TOPOLOGY_RACK_LABEL", "").strip()),
            links=_links(environ.get("CARAMEL_TOPOLOGY_LINKS", "").strip()),
        )

    @property
    def rendezvous_timeout_seconds(self) -> float:
        """How long the workers of a gang wait for each other: at least as long as part of a gang
        may wait for the rest to be scheduled, or worker 0 gives up on a peer the operator still
        waits for, and the gang fails instead of being released."""
        return max(RENDEZVOUS_TIMEOUT_SECONDS, self.gang_scheduling_timeout_seconds)

    def restart_backoff(self, restarts_so_far: int) -> float:
        """Exponential backoff before restart number restarts_so_far + 1."""
        return min(self.restart_backoff_max_seconds, self.restart_backoff_seconds * 2**restarts_so_far)


def _rack_label(text: str) -> str:
    if not text:
        return DEFAULT_RACK_LABEL
    if not LABEL_KEY_PATTERN.match(text):
        raise SettingsError(
            f"CARAMEL_TOPOLOGY_RACK_LABEL: expected a Kubernetes label key such as {DEFAULT_RACK_LABEL}, got {text!r}"
        )
    return text


def _links(text: str) -> ClusterLinks:
    if not text:
        return ClusterLinks()
    try:
        document = json.loads(text)
    except ValueError as error:
        raise SettingsError(f"CARAMEL_TOPOLOGY_LINKS: expected JSON such as {{\"rack\": {{\"gbps\": 25}}}}: {error}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"CARAMEL_TOPOLOGY_LINKS: expected a JSON object of levels (local, node, rack, zone), got {text!r}")
    try:
        return ClusterLinks.model_validate(document)
    except pydantic.ValidationError as error:
        problems = describe_validation_error(error)
        raise SettingsError(f"CARAMEL_TOPOLOGY_LINKS: {'; '.join(problems)}") from None
