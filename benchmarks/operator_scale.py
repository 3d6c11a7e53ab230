"""Operator scale, measured against kmock's Kubernetes API emulator (not a timed test).

    python -m benchmarks.operator_scale [--workers 256] [--jobs 100] [--repeat 3]

1. Time from creating one CaramelJob with --workers workers until all its pods exist.
2. The operator's memory (RSS) while it manages --jobs jobs of 2 workers each, all running.

The emulator answers from memory on this machine, so (1) measures the operator's own work plus
local HTTP, not a real apiserver's admission and storage. Prints a table; run with the
project's virtualenv.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from testbed.operator_harness import Emulator, Operator, eventually

SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"]}


def time_to_all_pods(workers: int, directory: Path) -> float:
    emulator = Emulator(directory)
    operator = Operator(emulator, directory, CARAMEL_RECONCILE_INTERVAL_SECONDS="2")
    try:
        started = time.perf_counter()
        emulator.api.create_job("big", {**SPEC, "workers": {"replicas": workers}})
        eventually(lambda: len(emulator.api.pods("big")) == workers, timeout=600, what=f"{workers} pods")
        return time.perf_counter() - started
    finally:
        operator.stop()
        emulator.stop()


def memory_with_jobs(jobs: int, directory: Path) -> tuple[float, float, float]:
    """RSS in MiB: before any job, and median and peak while all jobs run."""
    emulator = Emulator(directory)
    operator = Operator(emulator, directory, CARAMEL_RECONCILE_INTERVAL_SECONDS="2")
    process = psutil.Process(operator.process.pid)
    try:
        idle = process.memory_info().rss / 2**20
        api = emulator.api
        for index in range(jobs):
            api.create_job(f"job-{index}", {**SPEC, "workers": {"replicas": 2}})
        eventually(lambda: len(api.items("/api/v1/namespaces/default/pods")) == 2 * jobs, timeout=600, what="all pods")
        for pod in api.items("/api/v1/namespaces/default/pods"):
            api.set_pod_status(pod["metadata"]["name"], {"phase": "Running"})
        eventually(
            lambda: all(job.get("status", {}).get("phase") == "Running" for job in api.items("/apis/caramel.dev/v1alpha1/namespaces/default/carameljobs")),
            timeout=600,
            what="all jobs running",
        )
        samples = []
        for _ in range(20):  # ten seconds: five reconcile rounds of every job
            samples.append(process.memory_info().rss / 2**20)
            time.sleep(0.5)
        return idle, statistics.median(samples), max(samples)
    finally:
        operator.stop()
        emulator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=256, help="workers of the big job (default 256)")
    parser.add_argument("--jobs", type=int, default=100, help="jobs for the memory measurement (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each measurement (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        creation = []
        for run in range(args.repeat):
            (root / f"c{run}").mkdir()
            creation.append(time_to_all_pods(args.workers, root / f"c{run}"))
            print(f"  run {run + 1}: {args.workers} pods in {creation[-1]:.2f} s", flush=True)
        memory = []
        for run in range(args.repeat):
            (root / f"m{run}").mkdir()
            memory.append(memory_with_jobs(args.jobs, root / f"m{run}"))
            print(f"  run {run + 1}: RSS idle {memory[-1][0]:.0f} MiB, with {args.jobs} jobs median {memory[-1][1]:.0f} MiB, peak {memory[-1][2]:.0f} MiB", flush=True)
    print()
    print("| measurement | median | min | max |")
    print("| --- | --- | --- | --- |")
    print(f"| create {args.workers}-worker job until all pods exist (s) | {statistics.median(creation):.2f} | {min(creation):.2f} | {max(creation):.2f} |")
    for label, column in (("idle", 0), (f"managing {args.jobs} jobs, median", 1), (f"managing {args.jobs} jobs, peak", 2)):
        values = [m[column] for m in memory]
        print(f"| operator RSS {label} (MiB) | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} |")


if __name__ == "__main__":
    main()
