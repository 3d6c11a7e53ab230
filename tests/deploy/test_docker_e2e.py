"""The images end to end: the operator's worker pods, run as docker containers of the runtime
image, and the operator's own image, which must run the operator and hold no TensorFlow.

Every worker container gets exactly what `caramel_operator.builders` puts in its pod: image,
command, environment, working directory and hostname. Its network alias is the DNS name the job's
headless Service would give the pod, so the workers find each other as they would in a
cluster, only without Kubernetes. Both images are built once, by scripts/build-image.sh, and
their sizes printed.
"""

from __future__ import annotations

import json
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
from caramel.launch import one_tensorflow
from caramel_operator.builders import build_worker_pods, worker_address
from conftest import REPO, job_manifest, require_binary, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

OPERATOR_IMAGE = "caramel-operator:0.1.0"
RUNTIME_IMAGE = "caramel-runtime:0.1.0"
BUILD_TIMEOUT = 2700  # a cold build downloads TensorFlow twice and compiles Horovod
RUN_TIMEOUT = 600
# How long the operator may take to start, with no cluster, as far as reading its cluster's config.
OPERATOR_START_TIMEOUT = 90


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


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Both images, as the working tree builds them, once for the module: {"operator": ..., "runtime": ...}.

    The build runs even when the images exist: docker's layer cache makes an unchanged tree
    cost seconds, and an image left from an older tree would test old code.
    """
    require_dockerd()
    print(f"\n--- scripts/build-image.sh: {OPERATOR_IMAGE} and {RUNTIME_IMAGE}", flush=True)
    started = time.monotonic()
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], cwd=REPO, timeout=BUILD_TIMEOUT)
    assert build.returncode == 0, "scripts/build-image.sh failed: its output is above"
    print(f"--- image build: {time.monotonic() - started:.1f} s", flush=True)
    for name in (OPERATOR_IMAGE, RUNTIME_IMAGE):
        size = int(docker("image", "inspect", "--format", "{{.Size}}", name).stdout)
        print(f"--- {name}: {size} bytes ({size / 1e6:.0f} MB)", flush=True)
    return {"operator": OPERATOR_IMAGE, "runtime": RUNTIME_IMAGE}


@pytest.fixture
def image(images: dict[str, str]) -> str:
    """The workers' image."""
    return images["runtime"]


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
    check = docker("run", "--rm", "--entrypoint", "python", image, "-m", one_tensorflow.__name__, check=False)
    assert check.returncode == 0, check.stdout
    assert "cuInit" not in everything, "a second TensorFlow probes for CUDA"

    # Kubernetes' runAsNonRoot accepts only a numeric, non-zero image user.
    # The pods set runAsUser, but an image run without it must not run as root either.
    user = docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user.isdigit() and int(user) > 0, f"the image runs as {user!r}"
    users = set(docker("inspect", "--format", "{{.Config.User}}", *names).stdout.split())
    assert users == {"10001:10001"}, f"workers ran as {users}"
    # Scripts write into their working directory (Horovod's examples their checkpoints).
    written = docker("run", "--rm", "--user", "10001:10001", "--entrypoint", "touch", image, "checkpoint-1.h5", check=False)
    assert written.returncode == 0, f"the image's working directory is not its user's: {written.stdout}"

    print(f"--- {len(names)} workers, start to all exited: {elapsed:.1f} s")
    print(f"--- rank 0 final step time (median): {final[0].step_seconds * 1000:.1f} ms")


# The distributions the operator's image must not hold: TensorFlow under any of its names, Keras
# (2 or 3) and Horovod.
WORKER_ONLY = sorted(one_tensorflow.TENSORFLOW_DISTRIBUTIONS | {"keras", "tf-keras", "horovod"})


@pytest.mark.timeout(BUILD_TIMEOUT + 300)
def test_operator_image_runs_the_operator_and_holds_no_tensorflow(images: dict[str, str]) -> None:
    image = images["operator"]
    # Its entry point and handlers import, and leave TensorFlow, Keras and Horovod unimported.
    code = "import json, sys, caramel_operator.__main__, caramel_operator.handlers; print(json.dumps(sorted(sys.modules)))"
    imported = docker("run", "--rm", "--entrypoint", "python", image, "-c", code)
    modules = {name.split(".")[0] for name in json.loads(imported.stdout.splitlines()[-1])}
    assert "caramel_operator" in modules and not modules & {"tensorflow", "keras", "horovod"}, sorted(modules)

    # None of them is installed: the runtime's own check finds no TensorFlow at all.
    check = docker("run", "--rm", "--entrypoint", "python", image, "-m", one_tensorflow.__name__, check=False)
    assert check.returncode == 1 and "found none" in check.stdout, check.stdout
    probe = (
        "import json; from importlib.metadata import distributions; "
        "names = {(d.metadata['Name'] or '').lower().replace('_', '-') for d in distributions()}; "
        f"print(json.dumps(sorted(names & set({WORKER_ONLY!r}))))"
    )
    installed = docker("run", "--rm", "--entrypoint", "python", image, "-c", probe)
    assert json.loads(installed.stdout.splitlines()[-1]) == [], installed.stdout

    # The image's own command is the Deployment's, run as a numeric non-root user.
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["Cmd"] == ["python", "-m", "caramel_operator"]
    assert config["User"].isdigit() and int(config["User"]) > 0, config["User"]

    # Started as the Deployment starts it (read-only root, /tmp its only writable place, no
    # capabilities), the operator registers its handlers and kopf runs its start-up, which gets
    # as far as looking for a cluster: there is none, so kopf retries, and the operator keeps running.
    name = f"caramel-operator-e2e-{uuid.uuid4().hex[:8]}"
    docker("run", "--detach", "--name", name, "--read-only", "--tmpfs", "/tmp", "--cap-drop=ALL",
           "--security-opt", "no-new-privileges", image)
    try:
        deadline = time.monotonic() + OPERATOR_START_TIMEOUT
        output = ""
        while time.monotonic() < deadline:
            output = logs(name)
            if "No configuration found" in output or "Service host/port is not set" in output:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the operator did not reach its cluster's configuration in {OPERATOR_START_TIMEOUT} s:\n{output}")
        assert "ModuleNotFoundError" not in output and "ImportError" not in output, output
        state = docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", f"the operator exited:\n{output}"
    finally:
        docker("rm", "--force", name, check=False)
