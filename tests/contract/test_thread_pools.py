"""TensorFlow's thread pools sized to each rank's share of its machine's CPUs: the rule and the
cgroup quota it reads (`caramel.contract.cpus`, on files laid out as cgroup v1 and v2 lay them
out), the ranks that share a machine (the env contract), the variables the worker gives its
training processes (keeping the job's), TensorFlow honouring them, and the quickstart run under a
real cgroup CPU quota of one CPU, whose training process gets the pools of one CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from caramel.contract.api import CaramelJob
from caramel.contract.cpus import cgroup_cpu_quota, machine_cpus, pool_sizes, pool_variables
from caramel.contract.env import WorkerContract, slot_env, worker_env
from conftest import REPO, caramel_command, job_manifest, write_manifest


@pytest.mark.parametrize(
    ("cpus", "ranks", "intra_op", "inter_op"),
    [
        (2, 2, 1, 2),  # caramel run's 2 workers on this 2-core machine
        (8, 2, 4, 4),  # a pod of 8 CPUs, 2 slots
        (64, 1, 64, 64),
        (1.5, 1, 1, 2),  # a pod limited to 1500m: a whole CPU per thread
        (2, 4, 1, 2),  # more ranks than CPUs: still a thread each
    ],
)
def test_each_rank_gets_a_thread_per_cpu_of_its_share_and_two_ops_at_once_at_least(cpus, ranks, intra_op, inter_op):
    sizes = pool_sizes(cpus, ranks)
    assert (sizes.intra_op, sizes.inter_op) == (intra_op, inter_op)


def test_no_ranks_is_refused():
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        pool_sizes(4, 0)


def cgroup(tmp_path, proc_line: str, files: dict[str, str]):
    (tmp_path / "proc").write_text(proc_line + "\n")
    for name, text in files.items():
        path = tmp_path / "fs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "fs", tmp_path / "proc"


@pytest.mark.parametrize(
    ("proc_line", "files", "quota"),
    [
        ("0::/kubepods/pod1/c1", {"kubepods/pod1/c1/cpu.max": "150000 100000\n"}, 1.5),
        ("0::/kubepods/pod1/c1", {"kubepods/pod1/c1/cpu.max": "max 100000\n"}, None),
        ("0::/", {"cpu.max": "400000 100000\n"}, 4.0),  # a container in its own cgroup namespace
        ("0::/kubepods/pod1/c1", {"cpu.max": "200000 100000\n"}, 2.0),  # its path not mounted: the mount's root
        ("4:cpu,cpuacct:/kubepods/pod2", {"cpu,cpuacct/kubepods/pod2/cpu.cfs_quota_us": "300000\n",
                                          "cpu,cpuacct/kubepods/pod2/cpu.cfs_period_us": "100000\n"}, 3.0),
        ("4:cpu,cpuacct:/", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ("1:name=systemd:/", {}, None),  # no CPU controller
        ("0::/x", {"x/cpu.max": "garbage\n"}, None),
    ],
)
def test_the_cgroup_quota_is_read_as_cgroup_v1_and_v2_write_it(tmp_path, proc_line, files, quota):
    root, proc = cgroup(tmp_path, proc_line, files)
    assert cgroup_cpu_quota(root, proc) == quota


def test_a_quota_below_the_cores_caps_the_cpus_and_none_leaves_them(tmp_path):
    root, proc = cgroup(tmp_path, "0::/", {"cpu.max": "50000 100000\n"})
    assert machine_cpus(root, proc) == 0.5
    assert machine_cpus(root, tmp_path / "no-such-file") >= 1


def contract_of(peers: list[str], worker_index: int, slots: int) -> WorkerContract:
    job = CaramelJob.model_validate(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "pools"},
         "spec": {"script": "train.py", "workers": {"replicas": len(peers), "slotsPerWorker": slots}}}
    )  # fmt: skip
    env = worker_env(job, worker_index, peers)
    return WorkerContract.from_env({**env, **slot_env(env, 0)})


def test_the_ranks_on_a_machine_are_its_workers_slots_and_those_of_workers_at_its_address():
    assert contract_of(["127.0.0.1"] * 3, 1, 2).ranks_on_this_machine == 6  # caramel run: one machine
    assert contract_of(["pods-0.svc", "pods-1.svc", "pods-2.svc"], 1, 2).ranks_on_this_machine == 2  # a pod each
    assert contract_of(["10.0.0.1", "10.0.0.1", "10.0.0.2"], 2, 1).ranks_on_this_machine == 1


def test_the_worker_gives_the_pools_the_job_left_unsized_and_says_which():
    sizes = pool_sizes(2, 2)
    variables, said = pool_variables({}, sizes)
    assert variables == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
    assert said == "TensorFlow's thread pools of each rank sized to its share of the CPUs (2 CPU(s), 2 rank(s) on this machine): 1 intra-op and 2 inter-op thread(s)"
    variables, said = pool_variables({"TF_NUM_INTRAOP_THREADS": "3"}, sizes)
    assert variables == {"TF_NUM_INTEROP_THREADS": "2"} and said.endswith("2 inter-op thread(s); TF_NUM_INTRAOP_THREADS=3 as the job sized it")
    variables, said = pool_variables({"TF_NUM_INTRAOP_THREADS": "0", "TF_NUM_INTEROP_THREADS": "4"}, sizes)
    assert variables == {} and said == "TensorFlow's thread pools as the job sized them (TF_NUM_INTRAOP_THREADS=0, TF_NUM_INTEROP_THREADS=4)"


COUNT_INTER_OP_THREADS = textwrap.dedent(
    """
    import os
    import tensorflow as tf
    tf.constant(1.0) + 1.0
    print(sum(open(f"/proc/self/task/{task}/comm").read().strip() == "tf_Compute" for task in os.listdir("/proc/self/task")))
    """
)


def test_tensorflow_starts_with_the_inter_op_pool_its_variable_gives():
    """What the worker relies on: TensorFlow reads TF_NUM_INTEROP_THREADS as it starts (its
    inter-op threads are named tf_Compute), whatever the machine's cores."""
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTEROP_THREADS": "3"}
    result = subprocess.run([sys.executable, "-c", COUNT_INTER_OP_THREADS], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "3"


@pytest.fixture
def one_cpu_cgroup() -> Iterator[Path]:
    """A cgroup of this machine with a CPU quota of one CPU (a pod's `limits.cpu: 1`), cgroup v1's
    cpu controller or cgroup v2's; its cgroup.procs file. Skipped where none can be made (not root,
    or no cpu controller)."""
    name = f"caramel-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/cpu")
    v2 = Path("/sys/fs/cgroup")
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / name
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")
        elif "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            group = v2 / name
            group.mkdir()
            (group / "cpu.max").write_text("100000 100000")
        else:
            pytest.skip("no cgroup cpu controller to limit a run's CPUs with")
    except OSError as error:
        pytest.skip(f"cannot make a cgroup with a CPU quota here: {error}")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):  # the run's processes leave it as they end
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_the_quickstart_under_a_one_cpu_limit_gets_the_pools_of_one_cpu(tmp_path, one_cpu_cgroup):
    """Issue 50: the quickstart ran a TensorFlow op before init, and in a pod limited to 1 CPU
    its ranks kept TensorFlow's pools. Run as one worker in a cgroup of one CPU, its training
    process starts with 1 intra-op and 2 inter-op threads (a thread per core would be 2 here)."""
    example = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())["spec"]
    manifest = job_manifest(name="quickstart", script=str(REPO / example["script"]), args=["--steps", "40", "--batch-size", "16"], workers={"replicas": 1})
    command = caramel_command("run", str(write_manifest(tmp_path, manifest)))
    run = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: one_cpu_cgroup.write_text(str(os.getpid())))  # fmt: skip
    try:
        pools = None
        deadline = time.monotonic() + 120
        while pools is None and run.poll() is None and time.monotonic() < deadline:
            for process in psutil.Process(run.pid).children(recursive=True):
                try:
                    environ = process.environ()
                except psutil.Error:
                    continue
                if "HOROVOD_RANK" in environ:
                    pools = (environ.get("TF_NUM_INTRAOP_THREADS"), environ.get("TF_NUM_INTEROP_THREADS"))
            time.sleep(0.1)
        _, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, err[-3000:]
    assert pools == ("1", "2"), err[-3000:]
    assert "(1 CPU(s), 1 rank(s) on this machine): 1 intra-op and 2 inter-op thread(s)" in err, err[-3000:]
    assert "TensorFlow started before" not in err
