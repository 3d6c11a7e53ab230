"""How many CPUs each training process may use, and so how many threads TensorFlow gives it.

TensorFlow sizes its thread pools to every core the process can be scheduled on. Where several
training processes share those cores (the slots of a worker, the workers of `caramel run` on one
machine), or where a pod's CPU limit is far below its node's cores, each process then runs more
threads than it has CPUs, and they take the CPU from each other and from the collectives' threads
(2 ranks on 2 cores, each with TensorFlow's pools against one intra-op thread each:
benchmarks/results/2026-11-29-horovod-scripts-thread-pools.txt). The worker entrypoint sizes the
pools of every training process it starts by `pool_sizes`, through TensorFlow's own variables
(`pool_variables`), and the benchmarks' control by the same rule. TensorFlow reads them as it
starts, whenever that is: a script that runs an op before it joins the ranks gets them too (an
earlier way, sizing them in the runtime's `init`, missed every such script, the quickstart's
among them). A size the script gives itself (`tf.config.threading`) wins over the variables.

The CPUs of a worker are those it may be scheduled on (its affinity), capped by its cgroup's CPU
quota (a pod's CPU limit; cgroup v2 or v1). No TensorFlow here: the benchmarks read the rule too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
INTRA_OP_VARIABLE = "TF_NUM_INTRAOP_THREADS"
INTER_OP_VARIABLE = "TF_NUM_INTEROP_THREADS"
"""TensorFlow's own variables for its pools: set in a job's spec.env, they win over Caramel's sizes."""
MIN_INTER_OP_THREADS = 2
"""Ops that may run at once: at least 2, as one inter-op thread runs independent ops one after
another, which measured slower than 2 where each rank had a single CPU."""


@dataclass(frozen=True)
class PoolSizes:
    """A training process's share of its machine's CPUs and the thread pools sized to it."""

    cpus: float
    """The CPUs the ranks on this machine share (`machine_cpus`)."""
    ranks: int
    """The training processes that share them (`WorkerContract.ranks_on_this_machine`)."""
    intra_op: int
    """Threads that one op's kernel may split its work over."""
    inter_op: int
    """Ops that may run at once."""


def pool_sizes(cpus: float, ranks: int) -> PoolSizes:
    """The pools of each of `ranks` training processes sharing `cpus` CPUs: a thread per CPU of
    its share (at least one), and at least MIN_INTER_OP_THREADS ops at once."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, not {ranks}")
    share = max(1, math.floor(cpus / ranks))
    return PoolSizes(cpus=cpus, ranks=ranks, intra_op=share, inter_op=max(MIN_INTER_OP_THREADS, share))


def pool_variables(environ: Mapping[str, str], sizes: PoolSizes) -> tuple[dict[str, str], str]:
    """The variables that give a training process the pools `sizes` where the worker's environment
    (the job's spec.env: `0` is TensorFlow's own default) leaves them unset; and what they are, for
    the log."""
    pools = ((INTRA_OP_VARIABLE, "intra-op", sizes.intra_op), (INTER_OP_VARIABLE, "inter-op", sizes.inter_op))
    variables = {variable: str(threads) for variable, _, threads in pools if not environ.get(variable)}
    sized = " and ".join(f"{variables[variable]} {name}" for variable, name, _ in pools if variable in variables)
    kept = ", ".join(f"{variable}={environ[variable]}" for variable, _, _ in pools if variable not in variables)
    if not sized:
        return variables, f"TensorFlow's thread pools as the job sized them ({kept})"
    share = f"its share of the CPUs ({sizes.cpus:g} CPU(s), {sizes.ranks} rank(s) on this machine)"
    return variables, f"TensorFlow's thread pools of each rank sized to {share}: {sized} thread(s)" + (f"; {kept} as the job sized it" if kept else "")


def machine_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float:
    """The CPUs this process may use: those it may be scheduled on, capped by its cgroup's quota."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = cgroup_cpu_quota(root, proc_cgroup)
    return min(cpus, quota) if quota is not None else cpus


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (a pod's CPU limit), None where it has none
    or none can be read. Reads the process's own cgroup, or where that is not found, the mount's
    root (a container in its own cgroup namespace sees its cgroup there)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            places = [root / relative, root]
            read = _v2_quota
        elif "cpu" in controllers.split(","):
            places = [mount / place for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct") for place in (relative, "")]
            read = _v1_quota
        else:
            continue
        for directory in places:
            quota = read(directory)
            if quota is not None:
                return None if math.isinf(quota) else quota
    return None


def _v2_quota(directory: Path) -> float | None:
    """cpu.max: "QUOTA PERIOD", or "max PERIOD" (no quota: infinity); None where unreadable."""
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return math.inf if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> float | None:
    """cpu.cfs_quota_us over cpu.cfs_period_us; a quota of -1 is none (infinity); None where unreadable."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return math.inf if quota < 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
