"""kubectl, helm and throwaway restricted namespaces, for the portable cluster suite (tests/cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from testbed.operator_harness import WatchEvents, eventually


REPO = Path(__file__).resolve().parent.parent
# The two images scripts/build-image.sh builds: the operator's, which the chart installs, and the
# workers', the operator's runtime image (the chart's runtimeImage), which the suite's jobs name.
OPERATOR_IMAGE = os.environ.get("CARAMEL_OPERATOR_IMAGE", "caramel-operator:0.1.0")
RUNTIME_IMAGE = os.environ.get("CARAMEL_RUNTIME_IMAGE", "caramel-runtime:0.1.0")
if "CARAMEL_IMAGE" in os.environ:
    raise RuntimeError(
        "CARAMEL_IMAGE named the one image there was; the operator and the workers now have one each: "
        "set CARAMEL_OPERATOR_IMAGE and CARAMEL_RUNTIME_IMAGE instead (defaults caramel-operator:0.1.0 and caramel-runtime:0.1.0)"
    )
RELEASE = "caramel-suite"
TOOLS = REPO / ".venv" / "bin"


def repository_and_tag(image: str) -> tuple[str, str]:
    """`registry:5000/team/caramel-runtime:1` as ("registry:5000/team/caramel-runtime", "1"), as the chart's values take it."""
    repository, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        raise ValueError(f"{image!r}: the suite needs an image with a tag")
    return repository, tag


def tool(name: str) -> str:
    path = TOOLS / name
    return str(path) if path.exists() else name


def run(*args: str, input: str | None = None, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def kubectl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return run(tool("kubectl"), *args, **kwargs)


def cluster_unavailable() -> str | None:
    """Why the suite cannot run here, or None."""
    config = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not all(Path(part).exists() for part in config.split(os.pathsep) if part):
        return f"no cluster: KUBECONFIG is unset and {config} does not exist (point KUBECONFIG at a cluster, or run scripts/kind-e2e.sh)"
    probe = subprocess.run([tool("kubectl"), "version", "--request-timeout=10s", "-o", "json"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no cluster answers at KUBECONFIG={config}: {probe.stderr.strip()[:300]}"
    return None


class Namespace:
    """A throwaway namespace that enforces Pod Security "restricted"."""

    def __init__(self) -> None:
        self.name = f"caramel-suite-{uuid.uuid4().hex[:6]}"
        kubectl("create", "namespace", self.name)
        kubectl("label", "namespace", self.name, "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest")

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]], check: bool = True) -> subprocess.CompletedProcess[str]:
        documents = manifest if isinstance(manifest, list) else [manifest]
        return kubectl("apply", "-n", self.name, "-f", "-", input=yaml.safe_dump_all(documents), check=check)

    def get(self, kind: str, name: str | None = None) -> Any:
        result = kubectl("get", "-n", self.name, kind, *([name] if name else []), "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def job(self, name: str) -> dict[str, Any]:
        return self.get("carameljob", name) or {}

    def phase(self, name: str) -> str | None:
        return (self.job(name).get("status") or {}).get("phase")

    def wait_for_phase(self, name: str, phases: set[str], timeout: float = 900) -> str:
        return cast(str, eventually(lambda: self.phase(name) in phases and self.phase(name), timeout, f"{name} in {phases}", interval=2))  # truthy: a phase

    def pods(self, job: str) -> list[dict[str, Any]]:
        pods = (self.get("pods") or {}).get("items", [])
        return [pod for pod in pods if pod["metadata"].get("labels", {}).get("caramel.dev/job") == job]

    def logs(self, pod: str) -> str:
        return kubectl("logs", "-n", self.name, pod, check=False).stdout

    def events(self, involved: str, reason: str | None = None) -> list[dict[str, Any]]:
        """The Events about object `involved` (by name), of one reason or all."""
        items = (self.get("events") or {}).get("items", [])
        return [e for e in items if e["involvedObject"]["name"] == involved and reason in (None, e["reason"])]

    def delete(self) -> None:
        kubectl("delete", "namespace", self.name, "--wait=false", check=False)


class PodWatch(WatchEvents):
    """`kubectl get pods --watch` of one job's pods, each event stamped as it arrives: when pods
    came and started, to well under the second the API's own times are written to."""

    def __init__(self, namespace: str, job: str) -> None:
        super().__init__()
        command = [tool("kubectl"), "get", "pods", "-n", namespace, "-l", f"caramel.dev/job={job}", "--watch", "--output-watch-events", "-o", "json"]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """kubectl writes each event as indented JSON over many lines: decode as soon as one is whole."""
        assert self._process.stdout is not None
        decoder, pending = json.JSONDecoder(), ""
        for line in self._process.stdout:
            pending += line
            try:
                event, end = decoder.raw_decode(pending.lstrip())
            except ValueError:
                continue
            self.add(event)
            pending = pending.lstrip()[end:]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)
        self._reader.join(timeout=10)
