"""Shared helpers: job manifests written for a test, free ports, and the repository's paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from process_marks import _no_process_unless_marked, pytest_collection_modifyitems  # noqa: F401  (the process marker)
from testbed.operator_harness import Emulator
from testbed.ports import free_port, free_port_block  # noqa: F401  (tests import them from here)

REPO = Path(__file__).resolve().parent.parent
SMALL_EXAMPLE = REPO / "examples" / "train_small.py"
# A topology file of two racks of two hosts, their uplinks a quarter of their links.
RACKS_TOPOLOGY = "kind: racks\nracks: 2\nhostsPerRack: 2\nlink: {gbps: 1}\nuplink: {gbps: 0.25}\n"

# Every process a test starts (ranks above all) sees the runtime image's packages, in which there is
# no matplotlib: testbed/without_matplotlib says why. This process keeps its sys.path.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "testbed" / "without_matplotlib"), os.environ.get("PYTHONPATH")]))


KERAS_2 = {"TF_USE_LEGACY_KERAS": "1"}
"""The environment in which tf.keras is Keras 2 (tf-keras) rather than TensorFlow's own Keras 3."""


def keras_env(version: int) -> list[dict[str, str]]:
    """A job's spec.env for tf.keras to be Keras `version`: 3 or 2."""
    return [{"name": name, "value": value} for name, value in KERAS_2.items()] if version == 2 else []


def horovod_installed() -> bool:
    """Whether the real Horovod is installed (looked up without Caramel's `horovod` package on the path)."""
    from importlib.machinery import PathFinder

    from caramel.launch.entrypoint import HOROVOD_API_DIR

    return PathFinder.find_spec("horovod", [entry for entry in sys.path if Path(entry or ".").resolve() != Path(HOROVOD_API_DIR)]) is not None


needs_horovod = pytest.mark.skipif(not horovod_installed(), reason="Horovod is not installed (make setup builds it)")


def runtime_metrics() -> dict[str, str]:
    """Every metric a training process serves, by its queried name (counters end in _total), to its type."""
    from caramel.metrics import WorkerMetrics

    families = WorkerMetrics(rank=0).registry.collect()
    return {f"{family.name}_total" if family.type == "counter" else family.name: family.type for family in families}


@pytest.fixture
def emulator(tmp_path):
    """kmock's Kubernetes API emulator (testbed/kube_emulator.py), with the harness's nodes, for the operator's tests."""
    emulator = Emulator(tmp_path)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def one_rank():
    """A backend of a job of one rank (TensorFlow's, which needs no server for one): the unit tests'
    collectives, whose results are their inputs."""
    from caramel.collectives.tensorflow_backend import TensorFlowBackend

    return TensorFlowBackend(rank=0, size=1, local_rank=0, local_size=1, timeout_seconds=10.0)


MOST_RANKS = 8
"""The most ranks a test's job has: each rank takes a port of each block job_manifest picks."""


def job_manifest(name: str = "test-job", **spec: Any) -> dict[str, Any]:
    """A CaramelJob manifest for the small example, with free ports; spec entries override, and
    entries of spec.caramel override its own."""
    base = {
        "script": str(SMALL_EXAMPLE),
        "args": ["--steps", "40", "--batch-size", "32", "--hidden", "64"],
        "workers": {"replicas": 2},
        "rendezvous": {"port": free_port_block(1 + MOST_RANKS)},  # and the collective ports after it
        "metrics": {"port": free_port_block(MOST_RANKS)},
    }
    # The multitree transport's ports too: a job that may run it (allreduce auto, the default)
    # claims them from 29500 on, which two tests running side by side would both claim.
    caramel = {"transportPort": free_port_block(MOST_RANKS), **spec.pop("caramel", {})}
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name}, "spec": {**base, "caramel": caramel, **spec}}


def write_manifest(directory: Path, manifest: dict[str, Any], filename: str = "job.yaml") -> Path:
    path = directory / filename
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def caramel_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "caramel.launch.cli", *args]


def run_caramel(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        caramel_command(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL
    )


def unavailable(message: str) -> None:
    """A system part the test needs is missing: skip here, but fail in CI, which installs it."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_binary(name: str, package: str | None = None) -> str:
    """The path of a system binary (from Debian package `package`, default `name`)."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (.ci/run installs it: apt-get install {package or name})")
    return path
