"""How soon the operator restarts a gang after a worker goes, against the Kubernetes API emulator:
the measurement that tests/operator/test_operator_restarts.py bounds and benchmarks/operator_restart.py
reports.

Times come from the emulator's watch streams (operator_harness.Watch), taken as each event
arrives: polling would add its own interval to every figure. The emulator removes a deleted pod
at once and has no kubelet, so this is the operator's part only: on a cluster the deleted pod and
its peers first take their time to stop, and the new pods theirs to start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from caramel_operator.config import OperatorSettings
from testbed.operator_harness import JOBS, PODS, KubeApi, Watch, terminated

# The settings restart timings depend on, at their defaults (the harness's are fast, for tests).
DEFAULT_TIMINGS = {
    variable: str(OperatorSettings.model_fields[field].default)
    for variable, field in (
        ("CARAMEL_RECONCILE_INTERVAL_SECONDS", "reconcile_interval_seconds"),
        ("CARAMEL_RESTART_BACKOFF_SECONDS", "restart_backoff_seconds"),
    )
}
# Ways a worker goes: its pod deleted (as by `kubectl delete pod`), or its container crashed.
WAYS = ("deleted", "crashed")


@dataclass(frozen=True)
class Restart:
    """Seconds from a worker's going until its job was Restarting, and until every pod of the new gang existed."""

    restarting: float
    created: float


class RestartClock:
    """Watches of the emulator's pods and jobs, for timing restarts; close() before the emulator stops."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.pods = Watch(api.url, PODS)
        self.jobs = Watch(api.url, JOBS)

    def time(self, name: str, spec: dict[str, Any], way: str) -> Restart:
        """Run job `name` until Running, make its worker 1 go (`way`, one of WAYS), and time the
        restart. The job is left as it is then: its new gang created, not running."""
        if way not in WAYS:
            raise ValueError(f"way: expected one of {', '.join(WAYS)}, got {way!r}")
        self.api.running_job(name, spec)
        replicas = spec.get("workers", {}).get("replicas", 2)
        gone = time.monotonic()
        if way == "deleted":
            self.api.delete(f"{PODS}/{name}-worker-1")
        else:
            self.api.set_pod_status(f"{name}-worker-1", terminated(1))
        restarting = self.jobs.first(gone, lambda job: job["metadata"]["name"] == name and (job.get("status") or {}).get("phase") == "Restarting")
        created = self.pods.first(gone, lambda pod: _labels(pod).get("caramel.dev/job") == name and _labels(pod).get("caramel.dev/gang") == "1", count=replicas)
        return Restart(restarting=restarting[name] - gone, created=max(created.values()) - gone)

    def close(self) -> None:
        self.pods.close()
        self.jobs.close()


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}
