"""The gang supervisor (caramel.launch.gang) that `caramel run`, the worker entrypoint and the
benchmarks share: members started together, their lines relayed, the gang ended by the first
failure or by its caller, and no member left behind. And `caramel run`'s gang of workers with a
training command that needs no TensorFlow."""

from __future__ import annotations

import re
import sys
import time

import psutil
import pytest

from caramel.contract.jobfile import parse_job
from caramel.contract.restart import NOT_RESTARTED
from caramel.launch.gang import CannotStart, GangEnd, run_gang
from caramel.launch.launcher import LocalRun
from caramel.launch.processes import spawn, stop_groups
from conftest import REPO, free_port_block
import benchmarks.jobrun as jobrun
from benchmarks.jobrun import RunFailed, run_job

# Every test starts members; the benchmarks' through a cluster object whose spawn the collection
# cannot follow (tests/process_marks.py).
pytestmark = pytest.mark.process

def python(code: str):
    return spawn([sys.executable, "-c", code], {"PYTHONUNBUFFERED": "1"})


def run(codes: list[str], started: list[psutil.Process] | None = None, **options):
    """Run a gang of Python processes; `started` collects them as they start."""
    lines: list[tuple[int, str]] = []
    started = [] if started is None else started

    def start(member: int):
        process = python(codes[member])
        started.append(psutil.Process(process.pid))
        return process

    end = run_gang(len(codes), start, lambda member, line: lines.append((member, line)), **options)
    return end, lines, started


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert not alive, [process.cmdline() for process in alive]


def test_a_gang_whose_members_all_exit_0_succeeds_with_every_line_relayed():
    end, lines, started = run(["print('a'); print('b')", "import time; time.sleep(0.3); print('c')"])
    assert end == GangEnd() and end.succeeded
    assert sorted(lines) == [(0, "a"), (0, "b"), (1, "c")]
    assert_all_gone(started)


def test_the_first_failure_ends_the_gang_is_told_at_once_and_keeps_its_last_lines():
    told, started = [], []
    end, lines, _ = run(
        ["import time; print('waiting', flush=True); time.sleep(60)", "print('about to fail'); raise SystemExit(3)"],
        started,
        on_failure=lambda member, returncode: told.append((member, returncode, any(p.is_running() for p in started))),
    )
    assert (end.failed, end.returncode, end.stopped, end.succeeded) == (1, 3, "", False)
    assert told == [(1, 3, True)]  # before its peers were stopped
    assert (1, "about to fail") in lines
    assert_all_gone(started)


def test_the_member_that_failed_first_is_blamed_though_a_peer_failed_right_after(tmp_path):
    """A worker killed takes its peers down within milliseconds, each with its own error. A look
    at every member now and then found both failed and blamed the lowest-numbered: the peer that
    followed. Here member 1 kills itself and member 0 fails once it is dead, both long before a
    look every 2 s would come."""
    pid_file = tmp_path / "member-1.pid"
    follow = (
        "import os, pathlib, sys, time\n"
        f"pid_file = pathlib.Path({str(pid_file)!r})\n"
        "while not pid_file.exists() or not pid_file.read_text(): time.sleep(0.01)\n"
        "stat = pathlib.Path(f'/proc/{pid_file.read_text()}/stat')\n"
        "while stat.exists() and stat.read_text().split()[2] != 'Z': time.sleep(0.001)\n"
        "sys.exit(1)  # Connection reset by peer"
    )
    die = f"import os, pathlib, signal; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); os.kill(os.getpid(), signal.SIGKILL)"
    end, _, started = run([follow, die], poll_seconds=2)
    assert (end.failed, end.returncode) == (1, -9), end
    assert_all_gone(started)


def test_the_caller_stops_the_gang_and_nothing_is_left():
    deadline = time.monotonic() + 0.5
    end, _, started = run(
        ["import time; time.sleep(60)"] * 2, stop_reason=lambda: "deadline" if time.monotonic() > deadline else None
    )
    assert end == GangEnd(stopped="deadline", still_running=(0, 1)) and not end.succeeded
    assert_all_gone(started)


def test_a_member_that_cannot_start_stops_the_ones_started_before_it():
    started: list[psutil.Process] = []

    def start(member: int):
        if member == 1:
            return spawn(["/no/such/trainer"], {})
        process = python("import time; time.sleep(60)")
        started.append(psutil.Process(process.pid))
        return process

    with pytest.raises(CannotStart) as raised:
        run_gang(2, start, lambda member, line: None)
    assert raised.value.member == 1 and isinstance(raised.value.error, FileNotFoundError)
    assert_all_gone(started)


def local_job(code: str, **spec):
    return parse_job({
        "apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "gang"},
        "spec": {"command": [sys.executable, "-c", code], "workers": {"replicas": 2}, "workingDir": str(REPO),
                 "rendezvous": {"port": free_port_block(3)}, "metrics": {"enabled": False}, **spec},
    })  # fmt: skip


def local_run(job):
    logs, notices = [], []
    outcome = LocalRun(job, lambda worker, line: logs.append((worker, line)), lambda report: None, notices.append).run()
    return outcome, logs, notices


def meeting(directory) -> str:
    """Python code by which every rank waits for the others, as a training script's hvd.init()
    does: worker 0 stops serving the rendezvous when its ranks end, and a peer that had not
    reached it by then would wait for it until the rendezvous timeout."""
    return (
        "import os, pathlib, time\n"
        f"meeting = pathlib.Path({str(directory)!r})\n"
        "(meeting / os.environ['HOROVOD_RANK']).touch()\n"
        "while len(list(meeting.iterdir())) < int(os.environ['HOROVOD_SIZE']): time.sleep(0.01)\n"
    )


def test_caramel_run_relays_every_workers_lines_and_succeeds(tmp_path):
    outcome, logs, _ = local_run(local_job(meeting(tmp_path) + "print('hello from', os.environ['HOROVOD_RANK'])"))
    assert outcome.succeeded and outcome.reason == "all workers finished" and outcome.restarts == 0, (outcome, logs)
    assert {(0, "rank 0 | hello from 0"), (1, "rank 1 | hello from 1")} <= set(logs), logs


def test_caramel_run_restarts_a_failed_gang_up_to_the_backoff_limit_and_keeps_the_failed_workers_lines():
    code = "import os, sys; print('rank', os.environ['HOROVOD_RANK'], 'fails' if os.environ['HOROVOD_RANK'] == '1' else 'waits', flush=True); import time; time.sleep(0 if os.environ['HOROVOD_RANK'] == '1' else 60); sys.exit(5)"
    outcome, _, notices = local_run(local_job(code, runPolicy={"backoffLimit": 1}))
    assert not outcome.succeeded and outcome.failed_worker == 1 and outcome.restarts == 1
    assert outcome.reason == "worker 1 exited with code 5 (after 1 restarts: spec.runPolicy.backoffLimit reached)"
    assert "rank 1 | rank 1 fails" in outcome.last_lines
    [notice] = notices
    assert notice.startswith("worker 1 exited with code 5; restarting the whole gang (1 of 1, spec.runPolicy.backoffLimit) in 1 s")


SCRIPT_BUG = "raise ValueError('learning_rate must be positive, got -0.1')"
PROGRESS = "caramel-progress step=1 total=9 loss=1 step_seconds=0.1 examples_per_second=10 final=0"


# Caramel's refusal of a feature it does not serve, as caramel.tensorflow.unsupported raises it.
NOT_SERVED = (
    "class NotSupportedByCaramel(NotImplementedError): pass\n"
    "raise NotSupportedByCaramel('hvd.join() is not supported by Caramel: let every rank run the same steps')"
)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (SCRIPT_BUG, "ValueError: learning_rate must be positive, got -0.1"),
        (NOT_SERVED, "NotSupportedByCaramel: hvd.join() is not supported by Caramel: let every rank run the same steps"),
    ],
    ids=["value-error", "not-served"],
)
def test_caramel_run_fails_at_once_where_every_rank_raised_before_the_first_step(tmp_path, code, error):
    outcome, _, notices = local_run(local_job(meeting(tmp_path) + code))
    assert not outcome.succeeded and outcome.script_error and outcome.restarts == 0 and not notices
    # Either worker may be the first to fail: each quotes its own rank's error.
    assert re.fullmatch(rf"worker (\d) exited with code 1: rank \1 \| {re.escape(error)}; {re.escape(NOT_RESTARTED)}", outcome.reason), outcome.reason


@pytest.mark.parametrize(
    ("code", "spec"),
    [
        # After rank 0's first step: the step may be what went wrong (bad data), and a checkpoint resumes past it.
        (f"import os\nif os.environ['HOROVOD_RANK'] == '0': print({PROGRESS!r}, flush=True)\n{{meeting}}time.sleep(0.5); {SCRIPT_BUG}", {}),
        ("{meeting}" + SCRIPT_BUG, {"restartOnScriptError": True}),
        ("{meeting}raise ConnectionResetError(104, 'Connection reset by peer')", {}),  # a peer's failure, not the script's bug
    ],
    ids=["after-the-first-step", "restart-on-script-error", "a-peers-failure"],
)
def test_caramel_run_restarts_a_gang_whose_script_raised_after_its_first_step_or_where_the_job_asks(tmp_path, code, spec):
    outcome, _, notices = local_run(local_job(code.format(meeting=meeting(tmp_path)), runPolicy={"backoffLimit": 1, **spec}))
    assert not outcome.succeeded and not outcome.script_error and outcome.restarts == 1 and len(notices) == 1, outcome
    assert outcome.reason.endswith("(after 1 restarts: spec.runPolicy.backoffLimit reached)")


def test_caramel_run_stops_a_gang_past_its_deadline_without_a_restart():
    outcome, _, notices = local_run(local_job("import time; time.sleep(60)", runPolicy={"activeDeadlineSeconds": 1}))
    assert not outcome.succeeded and outcome.failed_worker is None and outcome.restarts == 0 and not notices
    assert outcome.reason == "spec.runPolicy.activeDeadlineSeconds (1 s) exceeded"


class LocalCluster:
    """What run_job asks of an EmulatedCluster, with every worker on this machine."""

    def __init__(self) -> None:
        self.processes: list = []

    def address(self, index: int) -> str:
        return "127.0.0.1"

    def spawn(self, index, argv, env, hostname=None, cwd=None):
        process = spawn(argv, env, cwd=str(cwd))
        self.processes.append(process)
        return process

    def stop_processes(self) -> None:
        stop_groups([process for process in self.processes if process.poll() is None])


@pytest.fixture
def benchmark_job(monkeypatch):
    """A benchmark's job of two workers running Python code, its rendezvous on a free port."""
    monkeypatch.setattr(jobrun, "RENDEZVOUS_PORT", free_port_block(3))  # and the two ranks' collective ports after it
    return lambda code: jobrun.bench_job("bench", [sys.executable, "-c", code], workers=2, interface=None)


def test_a_benchmarks_workers_run_as_a_gang_and_their_json_lines_are_its_events(tmp_path, benchmark_job):
    (tmp_path / "meeting").mkdir()
    code = meeting(tmp_path / "meeting") + "import json; print(json.dumps({'event': 'hello', 'from': os.environ['HOROVOD_RANK']}))"
    seen = []
    result = run_job(LocalCluster(), benchmark_job(code), 60, tmp_path / "workers.log", on_event=seen.append)
    assert sorted((event["from"], event["rank"]) for event in result.events) == [("0", 0), ("1", 1)] and seen == result.events
    assert "worker 1 | rank 1 | {" in (tmp_path / "workers.log").read_text()


def test_a_benchmark_fails_with_the_failed_workers_last_lines_or_times_out(tmp_path, benchmark_job):
    code = "import os, sys, time; print('rank', os.environ['HOROVOD_RANK'], flush=True); time.sleep(60 if os.environ['HOROVOD_RANK'] == '0' else 0); sys.exit(2)"
    with pytest.raises(RunFailed, match="worker 1 exited with code 2; its last lines:\n(.|\n)*rank 1 \\| rank 1"):
        run_job(LocalCluster(), benchmark_job(code), 60, tmp_path / "workers.log")
    with pytest.raises(RunFailed, match="timed out after 1 s; still running: worker 0, worker 1\nlast lines of worker 0:\n"):
        run_job(LocalCluster(), benchmark_job("import time; time.sleep(60)"), 1, tmp_path / "workers.log")
