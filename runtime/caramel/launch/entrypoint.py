"""The worker entrypoint: `python -m caramel.launch.entrypoint -- TRAINING COMMAND...`.

It reads the environment contract and meets the gang's other workers at the rendezvous, which
worker 0 serves (`caramel.launch.rendezvous`: Caramel's own, which imports no Horovod); once
every worker has joined it runs one training process per slot with that slot's ranks (from the
round joined), the job's memory allocator, TensorFlow's thread pools sized to the process's
share of the worker's CPUs (`caramel.contract.cpus`), and the worker's GPUs (CUDA_VISIBLE_DEVICES:
its block of the machine's, none for a job that asks for none; `caramel.contract.gpus`). A worker that comes back to an elastic gang which
trains (its first round closed long ago) joins no round itself: its training processes join the
open one once ready (`hvd.init`), and the others take them in at their next commit.
Every output line is prefixed with its rank. If any training process fails, the others are
stopped and the worker exits with the failed process's status, so the whole gang can be
restarted together. SIGTERM and SIGINT stop it at any point, the rendezvous wait included: as a
pod's PID 1 it would otherwise ignore SIGTERM and hold up every deletion for the whole grace
period. The training processes get SIGTERM at once, and Caramel's runtime ends each at its next
step boundary, within 2 s, writing nothing more (`caramel.tensorflow.stopping`); whatever is left
of them after the grace period gets SIGKILL.

Its last words go to CARAMEL_TERMINATION_MESSAGE_PATH (a pod's termination message): when the
job succeeds, worker 0 writes rank 0's last progress report, from which the operator records the
step the job ended at; when a rank fails, the worker writes which rank, when, whether its script
raised (an exception of its own, not a kill nor a peer's failure, and, on rank 0's worker, before
rank 0 reported a step: the restart policy fails such a job at once), the first line of its
output that reads as an error, and its last lines (`caramel.contract.termination`). Where
several ranks fail, it is the first to fail (the others follow it).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

from caramel.collectives.horovod_installation import HOROVOD_API_DIR
from caramel.contract.cpus import machine_cpus, pool_sizes, pool_variables
from caramel.contract.env import WorkerContract, slot_env
from caramel.contract.gpus import ASKED_FOR, CUDA_VISIBLE_DEVICES, worker_devices
from caramel.contract.progress import ProgressReport, parse_report
from caramel.contract.termination import (
    TERMINATION_MESSAGE_PATH_VARIABLE,
    RankOutput,
    ScriptRaised,
    failure_message,
    success_message,
)
from caramel.launch.allocator import allocator_setup
from caramel.launch.gang import CannotStart, run_gang
from caramel.launch.processes import describe_exit, exit_code, signal_group, spawn
from caramel.launch.rendezvous import (
    JOIN_WHEN_READY,
    MEMBER_VARIABLE,
    POLL_SECONDS,
    ROUND_VARIABLE,
    Beats,
    GangFinished,
    RendezvousServer,
    first_round_closed,
    join_round,
    parse_hosts,
)
from caramel.network.wire import job_topology

EXIT_CANNOT_START = 127  # as a shell reports a command it cannot run
EXIT_RENDEZVOUS_FAILED = 1
LOOPBACK = "127.0.0.1"
# Lines of each rank kept for its failure summary (more than a termination message holds).
LAST_LINES_KEPT = 100


class Stop:
    """The signal that stops the worker, noted by its handler and acted on by the loops, and
    passed on to the training processes at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0
        self.ranks: list[subprocess.Popen[bytes]] = []
        """The training processes started so far."""

    def started(self, rank: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.ranks.append(rank)
        return rank

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum
        self.event.set()
        # Now, not at the gang's next look: a rank that trained on meanwhile could start a
        # checkpoint after the worker was asked to stop. (SIGTERM: each rank stops at its next
        # step boundary, `caramel.tensorflow.stopping`.) Reaped ranks are left alone: their
        # process group's number may be another's now.
        for rank in self.ranks:
            if rank.returncode is None:
                signal_group(rank, signal.SIGTERM)

    @property
    def exit_status(self) -> int:
        return exit_code(-self.signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m caramel.launch.entrypoint -- TRAINING COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        contract = WorkerContract.from_env()
        job_topology(contract)  # a CARAMEL_TOPOLOGY that is no network fails here, before any rank starts
        gang = parse_hosts(contract.hosts)
    except RuntimeError as error:
        print(f"caramel-worker: {error}", file=sys.stderr)
        return 2

    def say(message: str) -> None:
        print(f"worker {contract.worker_index} | {message}", flush=True)

    stop = Stop()
    stop.install()
    server = None
    try:
        address = contract.rendezvous_addr
        try:
            if contract.worker_index == 0:
                server = RendezvousServer(contract.rendezvous_port, gang, contract.min_workers, contract.rendezvous_timeout_seconds)
                server.start()
                say(f"rendezvous serving on port {contract.rendezvous_port} for {contract.world_size} ranks")
                address = LOOPBACK  # its own server: no name to resolve, no network in between
            member = uuid.uuid4().hex
            # Where the gang may run short, a round the survivors of a lost worker meet at waits for
            # this worker's training processes while they run: it says so as long as they do.
            beats = None
            if contract.may_run_short:
                beats = Beats(address, contract.rendezvous_port, gang[contract.worker_index].name, member)
            if contract.worker_index and first_round_closed(address, contract.rendezvous_port, contract.rendezvous_timeout_seconds, stop.event, say):
                say("back to an elastic gang that trains: its training processes join the ranks at their next commit")
                rejoining = {ROUND_VARIABLE: JOIN_WHEN_READY, MEMBER_VARIABLE: member}
                return _run_slots(contract, argv, say, stop, beats, rejoining)
            joined = join_round(
                address, contract.rendezvous_port, gang[contract.worker_index], contract.rendezvous_timeout_seconds, stop.event, say, member
            )
        except GangFinished:
            say("the gang finished training before this worker could rejoin it: nothing left to do")
            return 0
        except (TimeoutError, RuntimeError, OSError) as error:
            say(str(error))
            _leave_message(str(error), say)
            return EXIT_RENDEZVOUS_FAILED
        if joined is None:
            say(f"stopped by {signal.Signals(stop.signum).name} while waiting for the rendezvous")
            return stop.exit_status
        say(f"all {len(joined.hosts)} workers joined round {joined.number} of the rendezvous: {joined.world_size} ranks")
        host = gang[contract.worker_index].name
        slot_ranks = [{**joined.rank_env(host, slot), MEMBER_VARIABLE: member} for slot in range(contract.slots_per_worker)]
        status = _run_slots(contract, argv, say, stop, beats, *slot_ranks)
        if server and status == 0 and server.rounds.finish():
            # A worker waiting to rejoin an elastic gang learns at its next look that the gang is done.
            time.sleep(2 * POLL_SECONDS)
        return status
    finally:
        if server:
            server.stop()


def _run_slots(
    contract: WorkerContract, argv: list[str], say: Callable[[str], None], stop: Stop, beats: Beats | None, *slot_ranks: dict[str, str]
) -> int:
    """Run the training processes, each slot with its variables of `slot_ranks` (its ranks in the
    round joined), or all with the one given (join when ready), saying they run with `beats`
    while they do (until one fails: then they are stopped, and no survivor to wait for)."""
    reports: list[ProgressReport] = []
    # Per rank, for a failure summary: what says why it failed, and its last lines.
    outputs: dict[int, RankOutput] = collections.defaultdict(RankOutput)
    last_lines: dict[int, collections.deque[str]] = collections.defaultdict(lambda: collections.deque(maxlen=LAST_LINES_KEPT))

    allocator = allocator_setup(contract.memory_allocator, os.environ)
    say(f"training processes: {allocator.description}")
    pools, pools_said = pool_variables(os.environ, pool_sizes(machine_cpus(), contract.ranks_on_this_machine))
    say(pools_said)
    devices = worker_devices(os.environ.get(CUDA_VISIBLE_DEVICES), contract.peers, contract.worker_index, contract.gpus_per_worker)
    if contract.gpus_per_worker:
        say(f"GPUs of the training processes: {devices or 'none left on this machine'} ({contract.gpus_per_worker} per worker, {ASKED_FOR}), one each")
    envs = []
    for slot in range(contract.slots_per_worker):
        env = {**os.environ, **slot_env(os.environ, slot), **slot_ranks[min(slot, len(slot_ranks) - 1)], **allocator.env, **pools}
        env[CUDA_VISIBLE_DEVICES] = devices
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HOROVOD_API_DIR, env.get("PYTHONPATH")]))
        envs.append(env)
    ranks = [int(env["HOROVOD_RANK"]) for env in envs]

    def relay(slot: int, line: str) -> None:
        rank = ranks[slot]
        prefixed = f"rank {rank} | {line}"
        print(prefixed, flush=True)
        report = parse_report(line) if rank == 0 else None
        if report:
            reports[:] = [report]
        else:
            outputs[rank].add(prefixed)
        last_lines[rank].append(prefixed)

    def headline(slot: int, returncode: int) -> str:
        return f"rank {ranks[slot]} {describe_exit(returncode)}"

    def failed(slot: int, returncode: int) -> None:
        say(f"{headline(slot, returncode)}; stopping the other ranks")
        if beats:
            beats.end()

    if beats:
        beats.start()
    try:
        end = run_gang(
            len(envs),
            lambda slot: stop.started(spawn(argv, envs[slot])),
            relay,
            stop_reason=lambda: "stopped" if stop.event.is_set() else None,
            on_failure=failed,
            poll_seconds=0.1,
        )
    except CannotStart as cannot:
        say(f"cannot start {argv[0]!r}: {cannot.error.strerror} (check spec.script or spec.command)")
        return EXIT_CANNOT_START
    finally:
        if beats:
            beats.end()
    if end.failed is not None and end.returncode is not None and end.failed_at is not None:
        rank = ranks[end.failed]
        output = outputs[rank]
        raised = None
        # A rank stopped with its worker may end as it will: that is no raise of its script's.
        if not stop.event.is_set() and output.raised_by_the_script(end.returncode):
            raised = ScriptRaised(before_first_step=0 in ranks and not reports)
        message = failure_message(headline(end.failed, end.returncode), end.failed_at, output.causes, last_lines[rank], raised)
        _leave_message(message, say)
        return exit_code(end.returncode)
    if end.stopped:
        return stop.exit_status or exit_code(-signal.SIGTERM)
    if reports:
        _leave_message(success_message(reports[0]), say)
    return 0


def _leave_message(text: str, say: Callable[[str], None]) -> None:
    """Write the worker's termination message, where the kubelet gave a file for it."""
    path = os.environ.get(TERMINATION_MESSAGE_PATH_VARIABLE)
    if not path:
        return
    try:
        with open(path, "w") as message:
            message.write(text + "\n")
    except OSError as error:  # no kubelet made the file (docker, say): the outcome stands
        say(f"cannot write the termination message to {path}: {error.strerror}")


if __name__ == "__main__":
    sys.exit(main())
