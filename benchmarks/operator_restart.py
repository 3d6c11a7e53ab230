"""How soon the operator restarts a gang, measured against kmock's Kubernetes API emulator (not a
timed test).

    python -m benchmarks.operator_restart [--repeat 3]

With the operator's default settings, for each placement (R-Storm, the default, and the
scheduler) and each way a worker goes (its pod deleted, its container crashed): a job of two
workers runs, worker 1 goes, and the time is taken from that moment until the job is Restarting
and until every pod of the new gang exists, from the emulator's watch events as they arrive. Each
trial has a job of its own, deleted after it.

The emulator removes a deleted pod at once and has no kubelet: this is the operator's part. On a
cluster, the deleted pod and its peers first take their time to stop (about a second), and the new
pods theirs to start. Prints a line per trial and a table; run with the project's virtualenv.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from caramel_operator.config import OperatorSettings
from testbed.operator_harness import JOBS, PODS, Emulator, KubeApi, Operator, eventually, terminated

SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"], "workers": {"replicas": 2}}
PLACEMENTS = ("RStorm", "Scheduler")
WAYS = ("deleted", "crashed")
# The settings the timings depend on, at their defaults (the harness's are fast, for tests).
DEFAULTS = {
    variable: str(OperatorSettings.model_fields[field].default)
    for variable, field in (
        ("CARAMEL_RECONCILE_INTERVAL_SECONDS", "reconcile_interval_seconds"),
        ("CARAMEL_RESTART_BACKOFF_SECONDS", "restart_backoff_seconds"),
    )
}


class Watch:
    """A watch of one collection of the emulator: every event, stamped with its arrival (time.monotonic())."""

    def __init__(self, url: str, path: str) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._changed = threading.Condition()
        address = urllib.parse.urlsplit(url)
        self._connection = http.client.HTTPConnection(address.hostname, address.port)
        self._connection.request("GET", f"{path}?watch=true")
        threading.Thread(target=self._read, args=(self._connection.getresponse(),), daemon=True).start()

    def _read(self, stream: http.client.HTTPResponse) -> None:
        try:
            for line in stream:
                if line.strip():
                    with self._changed:
                        self.events.append((time.monotonic(), json.loads(line)))
                        self._changed.notify_all()
        except OSError:
            pass  # closed

    def close(self) -> None:
        """End the stream: the emulator waits for its open streams when it stops."""
        if self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._connection.close()

    def when(self, since: float, matches: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 120) -> float:
        """When the count-th event after `since` whose object matches arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                seen = [at for at, event in self.events if at >= since and matches(event["object"])]
                if len(seen) >= count:
                    return seen[count - 1]
                if not self._changed.wait(deadline - time.monotonic()):
                    raise AssertionError(f"timed out after {timeout} s waiting for {count} events")


def labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def trial(api: KubeApi, pods: Watch, jobs: Watch, name: str, placement: str, way: str) -> tuple[float, float]:
    """Seconds from worker 1's going until the job is Restarting, and until the new gang's pods all exist."""
    api.running_job(name, {**SPEC, "placement": {"policy": placement}})
    replicas = SPEC["workers"]["replicas"]
    gone = time.monotonic()
    if way == "deleted":
        api.delete(f"{PODS}/{name}-worker-1")
    else:
        api.set_pod_status(f"{name}-worker-1", terminated(1))
    restarting = jobs.when(gone, lambda job: job["metadata"]["name"] == name and (job.get("status") or {}).get("phase") == "Restarting")
    created = pods.when(gone, lambda pod: labels(pod).get("caramel.dev/job") == name and labels(pod).get("caramel.dev/gang") == "1", count=replicas)
    api.delete(f"{JOBS}/{name}")
    eventually(lambda: not api.pods(name), what=f"the pods of {name} collected")
    return restarting - gone, created - gone


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="trials of each placement and way (default 3)")
    args = parser.parse_args()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        emulator = Emulator(Path(scratch))
        operator = Operator(emulator, Path(scratch), **DEFAULTS)
        pods, jobs = Watch(emulator.api.url, PODS), Watch(emulator.api.url, JOBS)
        try:
            for run in range(args.repeat):
                for placement in PLACEMENTS:
                    for way in WAYS:
                        name = f"{placement.lower()}-{way}-{run}"
                        took = trial(emulator.api, pods, jobs, name, placement, way)
                        results.setdefault((placement, way), []).append(took)
                        print(f"  {name}: Restarting after {took[0]:.2f} s, the new gang's pods after {took[1]:.2f} s", flush=True)
        finally:
            pods.close()
            jobs.close()
            operator.stop()
            emulator.stop()
    print()
    print(f"default settings ({', '.join(f'{k}={v}' for k, v in DEFAULTS.items())}), median (min-max) of {args.repeat}:")
    print("| placement | worker 1 | to Restarting | to the new gang's pods |")
    print("| --- | --- | --- | --- |")
    for (placement, way), taken in results.items():
        print(f"| {placement} | {way} | {spread([t[0] for t in taken])} | {spread([t[1] for t in taken])} |")


if __name__ == "__main__":
    main()
