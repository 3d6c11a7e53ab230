"""The worker entrypoint: `python -m caramel.launch.entrypoint -- TRAINING COMMAND...`.

It reads the environment contract, serves (worker 0) or awaits (the others) the rendezvous,
then runs one training process per slot with that slot's ranks and the job's memory allocator.
Every output line is prefixed with its rank. If any training process fails, the others are
stopped and the worker exits with the failed process's status, so the whole gang can be
restarted together. When the job succeeds, worker 0 writes rank 0's last progress report to
CARAMEL_TERMINATION_MESSAGE_PATH (a pod's termination message), from which the operator
records the step the job ended at.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from caramel.job.contract import WorkerContract, slot_env
from caramel.job.progress import ProgressReport, format_report, parse_report
from caramel.launch.allocator import allocator_setup
from caramel.launch.processes import describe_exit, exit_code, pump_lines, spawn, stop_groups
from caramel.launch.rendezvous import RendezvousServer, wait_for_rendezvous

# Worker 0 may start well after the others (a slow image pull, a busy scheduler).
RENDEZVOUS_WAIT_SECONDS = 600
EXIT_CANNOT_START = 127  # as a shell reports a command it cannot run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m caramel.launch.entrypoint -- TRAINING COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        contract = WorkerContract.from_env()
    except RuntimeError as error:
        print(f"caramel-worker: {error}", file=sys.stderr)
        return 2

    def say(message: str) -> None:
        print(f"worker {contract.worker_index} | {message}", flush=True)

    server = None
    if contract.worker_index == 0:
        server = RendezvousServer(contract.rendezvous_port, contract.hosts, contract.world_size)
        server.start()
        say(f"rendezvous serving on port {contract.rendezvous_port} for {contract.world_size} ranks")
    else:
        wait_for_rendezvous(
            contract.rendezvous_addr,
            contract.rendezvous_port,
            RENDEZVOUS_WAIT_SECONDS,
            on_wait=lambda waited: say(
                f"waiting for the rendezvous at {contract.rendezvous_addr}:{contract.rendezvous_port} ({waited:.0f} s)"
            ),
        )
    try:
        return _run_slots(contract, argv, say)
    finally:
        if server:
            server.stop()


def _run_slots(contract: WorkerContract, argv: list[str], say: Callable[[str], None]) -> int:
    processes = {}
    pumps = []
    reports: list[ProgressReport] = []

    def relay(rank: int, line: str) -> None:
        print(f"rank {rank} | {line}", flush=True)
        report = parse_report(line) if rank == 0 else None
        if report:
            reports[:] = [report]
    allocator = allocator_setup(contract.memory_allocator, os.environ)
    say(f"training processes: {allocator.description}")
    for slot in range(contract.slots_per_worker):
        env = {**os.environ, **slot_env(os.environ, slot), **allocator.env}
        rank = int(env["HOROVOD_RANK"])
        try:
            process = spawn(argv, env)
        except OSError as error:
            say(f"cannot start {argv[0]!r}: {error.strerror} (check spec.script or spec.command)")
            stop_groups(list(processes.values()))
            return EXIT_CANNOT_START
        processes[rank] = process
        pumps.append(pump_lines(process.stdout, lambda line, rank=rank: relay(rank, line)))

    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    status = 0
    while processes and not stopping:
        for rank, process in list(processes.items()):
            returncode = process.poll()
            if returncode is None:
                continue
            del processes[rank]
            if returncode != 0:
                say(f"rank {rank} {describe_exit(returncode)}; stopping the other ranks")
                status = exit_code(returncode)
                stopping = True
                break
        time.sleep(0.1)
    if processes:
        stop_groups(list(processes.values()))
        status = status or exit_code(-signal.SIGTERM)
    for pump in pumps:
        pump.join(timeout=5)
    termination_message = os.environ.get("CARAMEL_TERMINATION_MESSAGE_PATH")
    if status == 0 and reports and termination_message:
        # Only on success: a failed worker's message is the end of its log (FallbackToLogsOnError).
        try:
            with open(termination_message, "w") as message:
                message.write(format_report(reports[0]) + "\n")
        except OSError as error:  # no kubelet made the file: the training still succeeded
            say(f"cannot write the final report to {termination_message}: {error.strerror}")
    return status


if __name__ == "__main__":
    sys.exit(main())
