"""The operator under test, a real process, against the Kubernetes API emulator over HTTP.

The emulator (testbed/kube_emulator.py, kmock) stands in for kube-apiserver, which cannot run
here. Nothing else is simulated, except what a kubelet would do (tests patch pod status) and
the cluster's nodes: Node objects as the kubelets would have registered them, four by default.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml

from testbed.ports import free_port

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
JOBS = "/apis/caramel.dev/v1alpha1/namespaces/default/carameljobs"
PODS = "/api/v1/namespaces/default/pods"
SERVICES = "/api/v1/namespaces/default/services"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
EVENTS = "/api/v1/namespaces/default/events"
NODES = "/api/v1/nodes"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD = f"{CRDS}/carameljobs.caramel.dev"
PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups"
# Volcano's PodGroup CRD, as far as the API server's serving of it goes: its names and versions
# (Volcano's own schema is not needed where nothing validates against it).
PODGROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.volcano.sh"},
    "spec": {
        "group": "scheduling.volcano.sh",
        "names": {"kind": "PodGroup", "listKind": "PodGroupList", "plural": "podgroups", "singular": "podgroup", "shortNames": ["pg"]},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                "subresources": {"status": {}},
            }
        ],
    },
}
RACK_LABEL = "topology.caramel.dev/rack"


def node(name: str, rack: str, *, zone: str = "zone-a", cpu: str = "16", memory: str = "64Gi", ready: bool = True) -> dict[str, Any]:
    """A Node as a kubelet registers it: labels for its place in the network, its allocatable
    resources, and its Ready condition."""
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone, RACK_LABEL: rack}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


# A small cluster: two racks of two nodes.
DEFAULT_NODES = tuple(node(f"{rack}-node-{i}", rack) for rack in ("rack-1", "rack-2") for i in (1, 2))


class KubeApi:
    """A minimal JSON client of the emulator: what a test needs, and kubectl would do."""

    def __init__(self, url: str) -> None:
        self.url = url

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def items(self, path: str) -> list[dict[str, Any]]:
        return self.get(path)["items"]

    def create(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    # -- shortcuts -------------------------------------------------------------------------

    def create_job(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        metadata = {"name": name, "namespace": "default"}
        return self.create(JOBS, {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": metadata, "spec": spec})

    def job(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{JOBS}/{name}")

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def pods(self, job: str) -> list[dict[str, Any]]:
        return sorted(
            (pod for pod in self.items(PODS) if pod["metadata"].get("labels", {}).get("caramel.dev/job") == job),
            key=lambda pod: pod["metadata"]["name"],
        )

    def delete_crd(self) -> dict[str, Any]:
        """Delete the CaramelJob CRD, and with it every job; once it is gone, return it as
        `kubectl apply` would send it again (`create(CRDS, ...)`)."""
        crd = self.get(CRD)
        self.delete(CRD)
        eventually(lambda: self.get(CRD) is None, timeout=30, what="the CRD gone")
        for key in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "finalizers"):
            crd["metadata"].pop(key, None)
        crd.pop("status", None)
        return crd

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [event for event in self.items(EVENTS) if event.get("reason") == reason]

    def podgroup(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{PODGROUPS}/{name}")

    def set_podgroup_phase(self, name: str, phase: str) -> None:
        """Play Volcano's scheduler: move a PodGroup to `phase` (Inqueue: admitted)."""
        self.patch(f"{PODGROUPS}/{name}/status", {"status": {"phase": phase}})

    def set_pod_status(self, name: str, status: dict[str, Any]) -> None:
        """Play the kubelet: report a pod's state."""
        self.patch(f"{PODS}/{name}/status", {"status": status})

    def run_pods(self, job: str, phase: str = "Running", **extra: Any) -> None:
        for pod in self.pods(job):
            self.set_pod_status(pod["metadata"]["name"], {"phase": phase, **extra})

    def running_job(self, name: str, spec: dict[str, Any]) -> None:
        """Create a job, and play its gang's kubelets until the operator calls it Running."""
        self.create_job(name, spec)
        replicas = spec.get("workers", {}).get("replicas", 2)
        eventually(lambda: len(self.pods(name)) == replicas, what=f"{replicas} worker pods of {name}")
        self.run_pods(name)
        eventually(lambda: self.status(name).get("phase") == "Running", what=f"{name} Running")


class WatchEvents:
    """The events of a watch, each stamped with its arrival (time.monotonic()), for what polling
    would miss or blur: states that do not last, and when each came. A reader thread adds them."""

    def __init__(self) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._changed = threading.Condition()

    def add(self, event: dict[str, Any]) -> None:
        """One event as the API sends it, {"type": ..., "object": ...}, arrived now."""
        with self._changed:
            self.events.append((time.monotonic(), event))
            self._changed.notify_all()

    def first(self, since: float, matches: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 120) -> dict[str, float]:
        """When each of the first `count` objects to match after `since` first did, by name;
        waits for them."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                seen: dict[str, float] = {}
                for at, event in self.events:
                    if at >= since and matches(event["object"]):
                        seen.setdefault(event["object"]["metadata"]["name"], at)
                if len(seen) >= count:
                    return dict(list(seen.items())[:count])
                if not self._changed.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"timed out after {timeout} s waiting for {count} objects, seen {sorted(seen)}")

    def objects(self, matches: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The objects of the events so far that match, in order."""
        with self._changed:
            return [event["object"] for _, event in self.events if matches(event["object"])]


class Watch(WatchEvents):
    """A watch of one collection of the emulator. close() it before the emulator stops."""

    def __init__(self, url: str, path: str) -> None:
        super().__init__()
        address = urllib.parse.urlsplit(url)
        self._connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port)
        self._connection.request("GET", f"{path}?watch=true")
        self._reader = threading.Thread(target=self._read, args=(self._connection.getresponse(),), daemon=True)
        self._reader.start()

    def _read(self, stream: http.client.HTTPResponse) -> None:
        try:
            for line in stream:
                if line.strip():
                    self.add(json.loads(line))
        except (OSError, ValueError):
            pass  # closed: the chunked stream ends mid-chunk

    def close(self) -> None:
        """End the stream: the emulator waits for its open streams when it stops. The reader ends
        first: closing the connection under it breaks http.client's own clean-up."""
        if self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=10)
        self._connection.close()


def printer_row(job: dict[str, Any]) -> dict[str, Any]:
    """The `kubectl get cmj -o wide` row of a job, from the CRD's printer columns (kubectl needs a real server)."""
    from caramel_operator.crd import PRINTER_COLUMNS

    def follow(path: str) -> Any:
        value: Any = job
        for part in path.strip(".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return {column["name"]: follow(column["jsonPath"]) for column in cast("list[dict[str, Any]]", PRINTER_COLUMNS)}


def terminated(exit_code: int, reason: str = "Error", message: str = "", finished_at: str | None = None) -> dict[str, Any]:
    """Pod status of a worker whose container exited (at `finished_at`, RFC 3339, where given)."""
    state = {"exitCode": exit_code, "reason": reason, "message": message} | ({"finishedAt": finished_at} if finished_at else {})
    return {
        "phase": "Failed" if exit_code else "Succeeded",
        "containerStatuses": [
            {
                "name": "worker",
                "image": "caramel:test",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": state},
            }
        ],
    }


def eventually(check: Callable[[], T], timeout: float = 20, what: str = "condition", interval: float = 0.1) -> T:
    """Poll check() every `interval` seconds until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Emulator:
    """The emulator process."""

    def __init__(
        self,
        directory: Path,
        nodes: Sequence[dict[str, Any]] = DEFAULT_NODES,
        forbid: Sequence[str] = (),
        discovery_lag: float = 0.0,
        record: Path | None = None,
    ) -> None:
        """`nodes`: the cluster's Node objects; `forbid`: resources whose lists are refused (403);
        `discovery_lag`: how long after a CaramelJob CRD's creation discovery lists the resource;
        `record`: a file that gets a JSON line per request (see testbed/kube_emulator.py)."""
        url_file = directory / "emulator-url"
        options = [*(f"--forbid={plural}" for plural in forbid), f"--discovery-lag={discovery_lag}"]
        if record is not None:
            options.append(f"--record={record}")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "testbed.kube_emulator", str(url_file), *options],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(directory / "emulator.log").open("wb"),
        )
        url = cast(str, eventually(lambda: url_file.exists() and url_file.read_text(), what="the emulator to start"))  # truthy: the file's text
        self.api = KubeApi(url)
        for item in nodes:
            self.api.create(NODES, item)
        self.kubeconfig = directory / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                    "users": [{"name": "test", "user": {"token": "test"}}],
                    "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "test", "namespace": "default"}}],
                    "current-context": "emulator",
                }
            )
        )

    def stall(
        self, method: str, path: str, seconds: float, when: str = "before", watch: bool | None = None, name: str = ""
    ) -> None:
        """Hold every request of `method` whose path matches the regular expression `path`
        `seconds` long, before handling it (a hung call) or after (an answer that comes late);
        `watch`: only watches (True), or no watches (False); `name`: only requests about objects
        whose name matches this regular expression."""
        rule: dict[str, Any] = {"method": method, "path": path, "seconds": seconds, "when": when, "name": name}
        if watch is not None:
            rule["watch"] = watch
        self.api.request("POST", "/testbed/stall", rule)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class Operator:
    """`python -m caramel_operator` against the emulator, with fast timings for tests."""

    def __init__(self, emulator: Emulator, directory: Path, **env: str) -> None:
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.log = directory / f"operator-{self.health_port}.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "caramel_operator"],
            env={
                **os.environ,
                "KUBECONFIG": str(emulator.kubeconfig),
                "CARAMEL_OPERATOR_HEALTH_PORT": str(self.health_port),
                "CARAMEL_OPERATOR_METRICS_PORT": str(self.metrics_port),
                "CARAMEL_RECONCILE_INTERVAL_SECONDS": "0.3",
                "CARAMEL_RESTART_BACKOFF_SECONDS": "0.5",
                "CARAMEL_RUNTIME_IMAGE": "caramel:test",
                **env,
            },
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        eventually(self.healthy, timeout=30, what=f"the operator's liveness endpoint (log: {self.log})")

    def healthy(self) -> bool:
        """Whether the liveness endpoint answers 200."""
        return self.probe(self.health_port, "/healthz") == 200

    def ready(self) -> bool:
        """Whether the readiness endpoint answers 200."""
        return self.probe(self.metrics_port, "/readyz") == 200

    def probe(self, port: int, path: str) -> int | None:
        """The HTTP status of a probe of the operator, as the kubelet's (None: no answer)."""
        assert self.process.poll() is None, f"the operator exited:\n{self.log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def __enter__(self) -> Operator:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
