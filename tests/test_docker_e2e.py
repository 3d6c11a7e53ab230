"""The image end to end: the operator's worker pods, run as docker containers.

Every container gets exactly what `caramel_operator.builders` puts in its pod: image, command,
environment, working directory and hostname. Its network alias is the DNS name the job's
headless Service would give the pod, so the workers find each other as they would in a
cluster, only without Kubernetes.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from caramel.contract.jobfile import parse_job
from caramel.contract.progress import parse_report
from caramel_operator.builders import build_worker_pods, worker_address
from conftest import REPO, job_manifest, require_binary, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

IMAGE = "caramel:0.1.0"
BUILD_TIMEOUT = 2700  # a cold build downloads TensorFlow twice and compiles Horovod
RUN_TIMEOUT = 600


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A docker command; its output and errors are collected, both in stdout."""
    result = subprocess.run(
        ["docker", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stdout}")
    return result


def require_dockerd() -> None:
    """A daemon that does not answer skips the test, except in CI."""
    require_binary("docker", package="docker.io")
    server = docker("version", "--format", "{{.Server.Version}}", check=False)
    if server.returncode != 0:
        unavailable(f"dockerd does not answer (.ci/run starts it): {server.stdout.strip()}")


@pytest.fixture
def image() -> str:
    """caramel:0.1.0, as the working tree builds it.

    The build runs even when the image exists: docker's layer cache makes an unchanged tree
    cost seconds, and an image left from an older tree would test old code.
    """
    require_dockerd()
    print(f"\n--- scripts/build-image.sh: {IMAGE}", flush=True)
    started = time.monotonic()
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], cwd=REPO, timeout=BUILD_TIMEOUT)
    assert build.returncode == 0, "scripts/build-image.sh failed: its output is above"
    print(f"--- image build: {time.monotonic() - started:.1f} s", flush=True)
    return IMAGE


class Sandbox:
    """One docker network and the containers started on it; removes those and only those."""

    def __init__(self) -> None:
        self.suffix = uuid.uuid4().hex[:8]
        self.network = f"caramel-e2e-{self.suffix}"
        self.containers: list[str] = []

    def run_pod(self, pod: dict[str, Any], dns_name: str, termination_log: Path) -> str:
        """Starts the pod's one container, as a kubelet would, with the pod's name made unique and
        its termination message file bind-mounted from `termination_log`."""
        (container,) = pod["spec"]["containers"]
        name = f"{pod['metadata']['name']}-{self.suffix}"
        termination_log.touch()
        termination_log.chmod(0o666)
        command = container["command"]
        options = ["--name", name, "--hostname", pod["spec"]["hostname"]]
        options += ["--network", self.network, "--network-alias", dns_name, "--entrypoint", command[0]]
        # The pod's Pod Security "restricted" settings, as the kubelet applies them.
        security = pod["spec"]["securityContext"]
        options += ["--user", f"{security['runAsUser']}:{security['runAsGroup']}", "--group-add", str(security["fsGroup"])]
        if container["securityContext"]["allowPrivilegeEscalation"] is False:
            options += ["--security-opt", "no-new-privileges"]
        options += [f"--cap-drop={capability}" for capability in container["securityContext"]["capabilities"]["drop"]]
        options += ["--mount", f"type=bind,source={termination_log},target={container['terminationMessagePath']}"]
        if "workingDir" in container:
            options += ["--workdir", container["workingDir"]]
        for variable in container["env"]:
            options += ["--env", f"{variable['name']}={variable['value']}"]
        self.containers.append(name)  # before the run: a failed start can still leave a container
        docker("run", "--detach", *options, container["image"], *command[1:])
        return name

    def remove(self) -> None:
        if self.containers:
            docker("rm", "--force", *self.containers, check=False)
        docker("network", "rm", self.network, check=False)


@pytest.fixture
def sandbox(image: str) -> Iterator[Sandbox]:
    box = Sandbox()
    docker("network", "create", box.network)
    try:
        yield box
    finally:
        box.remove()


def logs(name: str) -> str:
    return docker("logs", name).stdout


@pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 300)
def test_worker_pods_train_in_containers(image: str, sandbox: Sandbox, tmp_path: Path) -> None:
    manifest = job_manifest(
        "docker-e2e", script="examples/train_small.py", args=["--steps", "60", "--batch-size", "32", "--hidden", "64"]
    )
    job = parse_job(manifest)
    pods = build_worker_pods(job, default_image=image)
    assert {pod["spec"]["containers"][0]["image"] for pod in pods} == {image}

    started = time.monotonic()
    messages = [tmp_path / f"termination-log-{index}" for index in range(len(pods))]
    names = [sandbox.run_pod(pod, worker_address(job, index), messages[index]) for index, pod in enumerate(pods)]
    try:
        exit_codes = [int(code) for code in docker("wait", *names, timeout=RUN_TIMEOUT).stdout.split()]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the workers did not all exit in {RUN_TIMEOUT} s:\n" + "\n".join(map(logs, names)))
    elapsed = time.monotonic() - started
    outputs = [logs(name) for name in names]
    everything = "\n".join(f"=== {name}\n{output}" for name, output in zip(names, outputs))
    assert exit_codes == [0] * len(names), everything
    # The image carries the allocator the entrypoint preloads (spec.workers.memoryAllocator).
    assert all("training processes: memory from tcmalloc" in output for output in outputs), everything

    digests = dict(re.findall(r"rank (\d+) \| caramel: weights digest (\w+)", everything))
    assert sorted(digests) == ["0", "1"], everything
    assert len(set(digests.values())) == 1, digests

    reports = [parse_report(line) for line in outputs[0].splitlines() if line.startswith("rank 0 | ")]
    final = [report for report in reports if report and report.final]
    assert len(final) == 1 and final[0].step == final[0].total == 60, outputs[0]
    # Worker 0 leaves rank 0's final report where the kubelet reads the termination message.
    assert parse_report(messages[0].read_text().strip()) == final[0]

    # One TensorFlow in the image: tf-keras's requirement must not have added the full one.
    check = docker("run", "--rm", "--entrypoint", "python", image, "-m", "caramel.launch.one_tensorflow", check=False)
    assert check.returncode == 0, check.stdout
    assert "cuInit" not in everything, "a second TensorFlow probes for CUDA"

    # Kubernetes' runAsNonRoot accepts only a numeric, non-zero image user.
    # The pods set runAsUser, but an image run without it must not run as root either.
    user = docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user.isdigit() and int(user) > 0, f"the image runs as {user!r}"
    users = set(docker("inspect", "--format", "{{.Config.User}}", *names).stdout.split())
    assert users == {"10001:10001"}, f"workers ran as {users}"

    print(f"--- {len(names)} workers, start to all exited: {elapsed:.1f} s")
    print(f"--- rank 0 final step time (median): {final[0].step_seconds * 1000:.1f} ms")
