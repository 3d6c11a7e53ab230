"""Running a benchmark job's workers in an EmulatedCluster, through Caramel's worker contract.

Each worker is started as `caramel run` and the operator start one: `worker_env` and
`worker_command` of a CaramelJob built with `parse_job`, with the namespaces' addresses as
peers and the job's worker names as hostnames. Worker 0's entrypoint serves the rendezvous; every
training process's TensorFlow server (Caramel's tensorflow backend, or MultiWorkerMirroredStrategy
in a baseline: mwms.py) listens on the contract's collective port, the rendezvous port plus one,
at its worker's address. The training processes get Caramel's `horovod` package first on their
path, as under `caramel run`; the plain-Horovod baselines bypass it (plain_horovod.py).
The workers' output lines (`rank N | ...` from the entrypoint) go to a log file; the JSON
lines among them are the benchmark's events.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from caramel.contract.api import CaramelJob, MemoryAllocator
from caramel.contract.env import worker_command, worker_env, worker_name
from caramel.contract.jobfile import parse_job
from caramel.launch.gang import run_gang
from caramel.launch.processes import describe_exit

from benchmarks.netem import EmulatedCluster

REPOSITORY = Path(__file__).resolve().parent.parent
RENDEZVOUS_PORT = 29400
LAST_LINES_KEPT = 12
_RANK_PREFIX = re.compile(r"rank (\d+) \| (.*)")


class RunFailed(Exception):
    """A worker failed or the run timed out; the message carries the failing worker's last lines."""


@dataclass
class RunResult:
    events: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    last_step_seconds: float = math.nan
    """When the last step any worker reported came, from the start (NaN if none did): what follows
    is the end of the workers' training loops (their input pipelines' teardown), their summaries and
    their exit."""


def bench_job(
    name: str,
    command: Sequence[str],
    workers: int,
    interface: str | None,
    env: dict[str, str] | None = None,
    caramel: dict | None = None,
    memory_allocator: MemoryAllocator = MemoryAllocator.TCMALLOC,
) -> CaramelJob:
    """The CaramelJob of one benchmark run: `workers` single-slot workers running `command`.

    interface, the cluster's interface name inside every namespace, becomes HOROVOD_GLOO_IFACE;
    caramel is the job's spec.caramel (Caramel's scheduling settings).
    """
    rendezvous = {"port": RENDEZVOUS_PORT, **({"networkInterface": interface} if interface else {})}
    return parse_job(
        {
            "apiVersion": "caramel.dev/v1alpha1",
            "kind": "CaramelJob",
            "metadata": {"name": name},
            "spec": {
                "command": list(command),
                "workers": {"replicas": workers, "memoryAllocator": memory_allocator.value},
                "rendezvous": rendezvous,
                "metrics": {"enabled": False},
                "caramel": caramel or {},
                "env": [{"name": key, "value": value} for key, value in (env or {}).items()],
            },
        },
        source=f"benchmark job {name}",
    )


def hostnames(job: CaramelJob) -> list[str]:
    return [worker_name(job, index) for index in range(job.spec.workers.replicas)]


def parse_event(line: str) -> dict | None:
    """The JSON object a training process printed on this line, or None for any other line."""
    match = _RANK_PREFIX.fullmatch(line)
    if not match or not match.group(2).startswith("{"):
        return None
    try:
        event = json.loads(match.group(2))
    except json.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    event.setdefault("rank", int(match.group(1)))
    return event


def run_job(
    cluster: EmulatedCluster,
    job: CaramelJob,
    timeout_seconds: float,
    log_path: Path,
    on_event: Callable[[dict], None] = lambda event: None,
) -> RunResult:
    """Run every worker of job to completion; RunFailed if one fails or the timeout passes.

    The workers are a gang (`caramel.launch.gang`), stopped by the cluster, which also clears
    their namespaces: whatever happens, no process of the run is left when this returns or raises.
    Each line of the log starts with when it came, in seconds from the start: where a job's time went.
    """
    peers = [cluster.address(index) for index in range(job.spec.workers.replicas)]
    started = time.monotonic()
    deadline = started + timeout_seconds
    events: list[dict] = []
    last_step_seconds = math.nan
    last_lines: dict[int, list[str]] = {index: [] for index in range(len(peers))}

    def start_worker(index: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, **worker_env(job, index, peers)}
        argv = worker_command(job, python=sys.executable)
        return cluster.spawn(index, argv, env, hostname=worker_name(job, index), cwd=REPOSITORY)

    with open(log_path, "w") as log:

        def follow(index: int, line: str) -> None:
            """Log the line, with when it came, and collect the event it may be."""
            nonlocal last_step_seconds
            log.write(f"{time.monotonic() - started:8.2f} s  worker {index} | {line}\n")
            last_lines[index] = (last_lines[index] + [line])[-LAST_LINES_KEPT:]
            event = parse_event(line)
            if event:
                if event.get("event") == "step":
                    last_step_seconds = time.monotonic() - started
                events.append(event)
                on_event(event)

        end = run_gang(
            len(peers),
            start_worker,
            follow,
            stop_reason=lambda: "timed out" if time.monotonic() > deadline else None,
            stop=lambda members: cluster.stop_processes(),
        )
    if end.failed is not None and end.returncode is not None:
        raise RunFailed(
            f"worker {end.failed} {describe_exit(end.returncode)}; its last lines:\n" + _indented(last_lines[end.failed])
        )
    if end.stopped:
        raise RunFailed(
            f"timed out after {timeout_seconds:.0f} s; still running: "
            + ", ".join(f"worker {index}" for index in end.still_running)
            + "".join(
                f"\nlast lines of worker {index}:\n" + _indented(last_lines[index] or ["(none)"])
                for index in end.still_running
            )
        )
    return RunResult(events=events, seconds=time.monotonic() - started, last_step_seconds=last_step_seconds)


def _indented(lines: list[str]) -> str:
    """A worker's lines, indented under the message that quotes them."""
    return "\n".join(f"    {line}" for line in lines)
