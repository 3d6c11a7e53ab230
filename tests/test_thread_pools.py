"""TensorFlow's thread pools sized to each rank's share of its machine's CPUs: the rule and the
cgroup quota it reads (`caramel.contract.cpus`, on files laid out as cgroup v1 and v2 lay them
out), the ranks that share a machine (the env contract), and the sizing itself in a fresh
TensorFlow process (`caramel.tensorflow.thread_pools`), which keeps the pools a job or a script
sized and says so where TensorFlow started first."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from caramel.contract.api import CaramelJob
from caramel.contract.cpus import cgroup_cpu_quota, machine_cpus, pool_sizes
from caramel.contract.env import WorkerContract, slot_env, worker_env
from conftest import REPO


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


SIZE_IN_A_FRESH_PROCESS = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    from caramel.contract.cpus import pool_sizes, machine_cpus
    from caramel.tensorflow.thread_pools import size_thread_pools
    from test_thread_pools import contract_of

    def pools():
        return [tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads()]

    share = pool_sizes(machine_cpus(), 2)
    os.environ["TF_NUM_INTRAOP_THREADS"] = "3"  # the job's spec.env sized one pool
    first = size_thread_pools(contract_of(["127.0.0.1"] * 2, 0, 1))
    after_first = pools()
    tf.constant(1.0) + 1.0  # TensorFlow starts: its pools exist
    del os.environ["TF_NUM_INTRAOP_THREADS"]
    late = size_thread_pools(contract_of(["127.0.0.1"] * 2, 0, 1))
    print(json.dumps({"share": [share.intra_op, share.inter_op], "first": first, "after_first": after_first, "late": late, "after_late": pools()}))
    """
)


def test_a_fresh_process_gets_the_pools_the_job_left_and_a_late_init_is_said_plainly():
    result = subprocess.run([sys.executable, "-c", SIZE_IN_A_FRESH_PROCESS], cwd=REPO / "tests", capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": f"{REPO / 'runtime'}:{REPO / 'tests'}:{REPO}", "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    intra_op, inter_op = seen["share"]
    assert seen["after_first"] == [0, inter_op]  # the intra-op pool left to TF_NUM_INTRAOP_THREADS
    assert f"{inter_op} inter-op thread(s); the other pool as the job sized it" in seen["first"]
    assert seen["after_late"] == [0, inter_op]  # nothing changed once TensorFlow had started
    assert "TensorFlow started before Caramel's init" in seen["late"]
