"""Running a CaramelJob on this machine: its workers as local processes, with no cluster and no ssh.

Each worker is started exactly as a pod would be, through `worker_env` and `worker_command`,
with 127.0.0.1 as every peer's address. The launcher relays their output, stops the whole gang
as soon as one worker fails, and never leaves a process behind. Like the operator, it then
restarts the whole gang, up to spec.runPolicy.backoffLimit times, after a backoff (shorter than
the operator's: 1 s, doubling up to 30 s; `caramel.contract.restart`); a job with spec.checkpoint
resumes from its latest checkpoint. Not where the worker that failed first says its script raised
(its termination message, in a file of the run's as a pod's is) and rank 0 had reported no step:
the same script would raise again, and the run fails at once, quoting the error.

This machine is the run's only node, and what it can take away from a gang is a worker: one it
kills (SIGKILL, what the kernel's out-of-memory killer sends) is lost, as a worker whose node
goes is in a cluster. Where spec.workers.minReplicas allows it, the next gang runs without it,
one worker fewer; any other failure restarts the whole gang, as a later restart in a cluster
asks for it again. Nothing here waits for room, so the gang scheduling timeout has no local
counterpart, and a gang grows back only at a restart.

An elastic gang (its script uses Horovod's `hvd.elastic`, its spec.workers.minReplicas is below
replicas: `caramel.contract.elastic`) is not restarted for a lost worker other than worker 0 (which
serves the rendezvous): its peers re-form without it in their processes, and the launcher starts
it again at once, in the place the machine has again, to rejoin them at their next commit. Each
such replacement counts against backoffLimit as a restart does.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from caramel.contract.api import CaramelJob
from caramel.contract.elastic import says_elastic
from caramel.contract.env import worker_command, worker_env
from caramel.contract.ports import PortMap
from caramel.contract.restart import NOT_RESTARTED, RestartPolicy
from caramel.contract.termination import TERMINATION_MESSAGE_PATH_VARIABLE, failure_cause, script_raised
from caramel.launch.gang import run_gang
from caramel.launch.processes import describe_exit, killed_by_the_machine, spawn
from caramel.contract.progress import ProgressReport, parse_report
from caramel.network.model import Topology
from caramel.network.wire import to_wire

LOCALHOST = "127.0.0.1"
LAST_LINES_KEPT = 20


class LaunchError(Exception):
    """The job cannot be started here; nothing was started."""


@dataclass
class RunOutcome:
    """How a local run ended."""

    succeeded: bool
    reason: str
    wall_seconds: float
    first_report: ProgressReport | None = None
    last_report: ProgressReport | None = None
    failed_worker: int | None = None
    last_lines: list[str] = field(default_factory=list)
    restarts: int = 0
    """Whole-gang restarts after a worker failed."""
    workers: int = 0
    """Workers of the last gang: spec.workers.replicas, or fewer after workers were lost."""
    lost: bool = False
    """The failed worker was killed by SIGKILL, as the machine kills what it cannot hold."""
    replaced: int = 0
    """Workers of an elastic gang lost and started again while it ran (they count against
    backoffLimit with the restarts)."""
    script_error: bool = False
    """The failed worker's script raised before rank 0's first step: no restart can help."""


# Why a signal stops a gang, by signal: the handlers only note it, and the gang's loop acts on it
# (`stop_reason`). An exception raised by the handler could land inside the queue the output
# pumps share (its lock taken and never released) and hang the clean-up that drains it.
STOP_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}


def check_can_start(job: CaramelJob, cwd: Path) -> None:
    """Fail with a message naming the field before anything starts, where a field cannot work here."""
    spec = job.spec
    if spec.script and not (cwd / spec.script).is_file():
        raise LaunchError(f"spec.script: {spec.script!r} is not a file (looked in {cwd})")
    if not cwd.is_dir():
        raise LaunchError(f"spec.workingDir: {str(cwd)!r} is not a directory")
    for port, name in PortMap.of(job).on_one_machine(job.world_size).items():
        with socket.socket() as probe:
            # As the rendezvous and metrics servers do: connections of an earlier run lingering
            # in TIME_WAIT do not make a port busy, a listening socket does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError:
                raise LaunchError(f"{name}: port {port} is already in use on this machine") from None


class LocalRun:
    """One run of a job's workers as local processes."""

    def __init__(
        self,
        job: CaramelJob,
        on_log: Callable[[int, str], None],
        on_progress: Callable[[ProgressReport], None],
        on_notice: Callable[[str], None] = lambda message: None,
        topology: Topology | None = None,
    ) -> None:
        self.job = job
        self.topology = topology
        self.on_log = on_log
        self.on_progress = on_progress
        self.on_notice = on_notice
        self.cwd = Path(job.spec.working_dir or os.getcwd())

    def run(self) -> RunOutcome:
        check_can_start(self.job, self.cwd)
        started = time.monotonic()
        policy = RestartPolicy.of(self.job)
        limit = policy.backoff_limit
        restarts = replaced = 0
        size = self.job.spec.workers.replicas
        while True:
            outcome = self._run_gang(started, size, policy, restarts + replaced)
            replaced += outcome.replaced
            outcome.restarts, outcome.replaced = restarts, replaced
            if outcome.succeeded or outcome.failed_worker is None or outcome.script_error or not policy.may_restart(restarts + replaced):
                break
            backoff = policy.backoff(restarts + replaced)
            restarts += 1
            size, sizing = self._next_size(outcome)
            tail = "".join(f"\n  | {line}" for line in outcome.last_lines)
            self.on_notice(
                f"{outcome.reason}; restarting the whole gang ({restarts + replaced} of {limit}, spec.runPolicy.backoffLimit) "
                f"in {backoff:.0f} s{sizing}. Its last lines:{tail}"
            )
            try:
                time.sleep(backoff)
            except KeyboardInterrupt:
                outcome.reason = "interrupted"
                outcome.failed_worker = None
                break
        if outcome.failed_worker is not None and restarts and not outcome.script_error:
            outcome.reason += f" (after {restarts} restarts: spec.runPolicy.backoffLimit reached)"
        outcome.wall_seconds = time.monotonic() - started
        return outcome

    def _next_size(self, failed: RunOutcome) -> tuple[int, str]:
        """The next gang's workers after the failed one, and what to tell of its size."""
        workers = failed.workers
        spec = self.job.spec.workers
        if failed.lost:  # the survivors fit: as many, never fewer than minReplicas
            if workers == spec.min_workers:
                return workers, ""
            return workers - 1, (
                f" with {workers - 1} of {spec.replicas} workers: worker {failed.failed_worker} was lost (killed by SIGKILL, as "
                f"the kernel does when the machine runs out of memory; spec.workers.minReplicas {spec.min_workers})"
            )
        if workers < spec.replicas:
            return spec.replicas, f" with all {spec.replicas} workers again"
        return spec.replicas, ""

    def _run_gang(self, started: float, replicas: int, policy: RestartPolicy, restarts: int) -> RunOutcome:
        """One gang of `replicas` workers: every worker started, run until all finish or one fails
        (one that an elastic gang can lose is started again instead, `restarts` counting those before)."""
        peers = [LOCALHOST] * replicas
        # The topology file has a host per rank of the whole gang; a gang short of workers runs on
        # the hosts of its first ones.
        topology = to_wire(self.topology).of_hosts(list(range(replicas * self.job.spec.workers.slots))) if self.topology else None
        last_lines: list[collections.deque[str]] = [collections.deque(maxlen=LAST_LINES_KEPT) for _ in range(replicas)]
        outcome = RunOutcome(False, "", 0.0, workers=replicas)
        # Each worker's last words, as a pod's termination message.
        messages = tempfile.TemporaryDirectory(prefix="caramel-run-")
        message_paths = [Path(messages.name, f"worker-{index}") for index in range(replicas)]

        def start_worker(index: int) -> subprocess.Popen[bytes]:
            env = {
                **os.environ,
                **worker_env(self.job, index, peers, topology=topology),
                TERMINATION_MESSAGE_PATH_VARIABLE: str(message_paths[index]),
            }
            return spawn(worker_command(self.job, python=sys.executable), env, cwd=str(self.cwd))

        elastic: list[bool] = []

        def relay(index: int, line: str) -> None:
            if not elastic and says_elastic(line):
                elastic.append(True)
            report = parse_report(line)
            if report:
                outcome.first_report = outcome.first_report or report
                outcome.last_report = report
                self.on_progress(report)
            else:
                last_lines[index].append(line)
                self.on_log(index, line)

        stops: list[str] = []

        def stop_reason() -> str | None:
            if stops:
                return stops[0]
            if policy.deadline_passed(time.monotonic() - started):
                return f"spec.runPolicy.activeDeadlineSeconds ({policy.active_deadline_seconds} s) exceeded"
            return None

        previous_handlers = {
            signum: signal.signal(signum, lambda signum, _: stops.append(STOP_REASONS[signal.Signals(signum)])) for signum in STOP_REASONS
        }
        def replace(index: int, returncode: int) -> bool:
            """A lost worker of an elastic gang, but for worker 0 (the rendezvous), while the
            restarts allow: started again, its peers going on."""
            if not (elastic and index != 0 and killed_by_the_machine(returncode) and replicas > self.job.spec.workers.min_workers):
                return False
            if not policy.may_restart(restarts + outcome.replaced):
                return False
            outcome.replaced += 1
            self.on_notice(
                f"worker {index} {describe_exit(returncode)}: the elastic gang goes on without it (its peers roll back to "
                f"their last commit), and it starts again to rejoin them ({restarts + outcome.replaced} of "
                f"{policy.backoff_limit}, spec.runPolicy.backoffLimit)"
            )
            return True

        try:
            with messages:
                end = run_gang(replicas, start_worker, relay, stop_reason=stop_reason, replace=replace)
                failed_message = _termination_message(message_paths[end.failed]) if end.failed is not None else ""
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
        if stops:  # a stop wins over a failure seen at the same time: no restart follows
            outcome.reason = stops[0]
        elif end.failed is not None and end.returncode is not None:
            outcome.failed_worker = end.failed
            outcome.reason = f"worker {end.failed} {describe_exit(end.returncode)}"
            outcome.lost = killed_by_the_machine(end.returncode)
            outcome.last_lines = list(last_lines[end.failed])
            # The worker that failed first is the cause; its peers were stopped, or failed after it.
            if policy.fails_at_once([script_raised(failed_message)], no_step_seen=outcome.first_report is None):
                outcome.script_error = True
                outcome.reason += f": {failure_cause(failed_message)}; {NOT_RESTARTED}"
        elif end.stopped:
            outcome.reason = end.stopped
        else:
            outcome.succeeded = True
            outcome.reason = "all workers finished"
        return outcome


def _termination_message(path: Path) -> str:
    """What a worker left in its termination message file; empty where it wrote none (killed)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
