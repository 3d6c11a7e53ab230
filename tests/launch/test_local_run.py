"""`caramel run` end to end: real TensorFlow and Horovod workers as local processes."""

from __future__ import annotations

import re
import signal
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import SMALL_EXAMPLE, job_manifest, run_caramel, runtime_metrics, write_manifest
from prometheus_server import PrometheusServer
from caramel.contract.progress import parse_report
from caramel.launch.launcher import LAST_LINES_KEPT
from testbed.local_runs import BackgroundRun, checkpoint_weights, digests

pytestmark = pytest.mark.e2e

# Every series the runtime defines, as Prometheus stores it (a histogram as its three parts).
EXPECTED_SERIES = [
    series
    for name, kind in runtime_metrics().items()
    for series in ([f"{name}_bucket", f"{name}_count", f"{name}_sum"] if kind == "histogram" else [name])
]


def test_two_workers_train_identically_and_serve_metrics(tmp_path):
    manifest = job_manifest(args=["--steps", "400", "--batch-size", "32", "--hidden", "64"])
    metrics_port = manifest["spec"]["metrics"]["port"]
    targets = [f"127.0.0.1:{metrics_port}", f"127.0.0.1:{metrics_port + 1}"]
    with PrometheusServer(tmp_path, targets) as prometheus:
        result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
        output = result.stderr
        assert result.returncode == 0, output

        first_loss, last_loss = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", output).groups())
        assert last_loss < 0.8 * first_loss, output

        by_rank = digests(output)
        assert sorted(by_rank) == [0, 1], output
        assert by_rank[0] == by_rank[1]

        time.sleep(2)  # one more scrape interval, so that the samples are queryable
        for name in EXPECTED_SERIES:
            series = prometheus.query(f"last_over_time({name}[5m])")
            assert {s["metric"]["rank"] for s in series} == {"0", "1"}, f"{name}: {series}"
        steps = prometheus.query("max_over_time(caramel_steps_total[5m])")
        assert all(float(s["value"][1]) > 0 for s in steps), steps


def assert_all_gone(processes: list[psutil.Process], timeout: float = 15) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"


def long_job(tmp_path, **spec):
    return write_manifest(tmp_path, job_manifest(args=["--steps", "1000000", "--batch-size", "32", "--hidden", "64"], **spec))


def test_a_killed_worker_fails_the_run_and_leaves_no_process(tmp_path):
    run = BackgroundRun(long_job(tmp_path, runPolicy={"backoffLimit": 0}))
    run.wait_for("caramel-progress")
    everything = run.descendants()
    assert len(run.gang()) == 4  # two entrypoints, two training processes
    run.training_process(1).send_signal(signal.SIGKILL)
    assert run.finish() == 1
    assert "Failed test-job: worker 1 exited with code 137" in run.output
    assert "last lines of worker 1:" in run.output
    assert "worker 1 | rank 1 killed by SIGKILL; stopping the other ranks" in run.output
    assert_all_gone(everything)


# TensorFlow's coordination service declares a task dead after this long without a heartbeat,
# unless told otherwise.
TENSORFLOW_DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 10


@pytest.mark.recovery
def test_a_rank_without_cpu_for_longer_than_tensorflows_heartbeat_timeout_does_not_fail_the_job(tmp_path):
    """On the tensorflow backend a rank that got no CPU for 10 s (a 4-rank job starting on 2 busy
    cores) failed the gang: "The following tasks are unhealthy (stopped sending heartbeats)". A
    stopped process (SIGSTOP) gets none at all, for as long as the test says."""
    manifest = job_manifest(args=["--steps", "300", "--batch-size", "32", "--hidden", "64"], caramel={"backend": "tensorflow"},
                            runPolicy={"backoffLimit": 0})  # fmt: skip
    run = BackgroundRun(write_manifest(tmp_path, manifest))
    run.wait_for("caramel-progress")
    starved = run.training_process(1)
    starved.send_signal(signal.SIGSTOP)
    try:
        time.sleep(TENSORFLOW_DEFAULT_HEARTBEAT_TIMEOUT_SECONDS * 1.5)
    finally:
        starved.send_signal(signal.SIGCONT)
    assert run.finish() == 0, run.output[-4000:]
    assert "unhealthy" not in run.output
    assert sorted(digests(run.output)) == [0, 1]


@pytest.mark.parametrize(
    ("signum", "exit_code", "message"),
    [
        (signal.SIGINT, 130, "Failed test-job: interrupted"),  # Ctrl-C
        (signal.SIGTERM, 1, "Failed test-job: stopped by SIGTERM"),
        (signal.SIGKILL, -signal.SIGKILL, None),  # no clean-up code runs: the kernel takes the workers down
    ],
)
def test_stopping_caramel_stops_every_worker(tmp_path, signum, exit_code, message):
    run = BackgroundRun(long_job(tmp_path))
    run.wait_for("caramel-progress")
    everything = run.descendants()
    run.process.send_signal(signum)
    assert run.finish() == exit_code
    if message:
        assert message in run.output
    assert_all_gone(everything)


@pytest.mark.recovery
def test_resume_continues_exactly_where_the_checkpoint_left_off_with_every_ranks_restored_learning_rate(tmp_path):
    """A run resumed from a checkpoint ends where an uninterrupted run does. Rank 0 restores the
    checkpoint, learning rate included, and every rank takes its values: the second half is
    started with another rate and trains on at the checkpoint's on every rank (a rate restored on
    rank 0 alone set the ranks' weights apart, and the run failed its end-of-run check)."""

    def job(directory, steps, rate="0.05"):
        manifest = job_manifest(
            args=["--steps", str(steps), "--batch-size", "32", "--hidden", "64", "--learning-rate", rate],
            checkpoint={"path": str(tmp_path / directory), "intervalSteps": 10},
        )
        return write_manifest(tmp_path, manifest, filename=f"{directory}-{steps}.yaml")

    straight = run_caramel("run", str(job("straight", 30)))
    assert straight.returncode == 0, straight.stderr

    first_half = run_caramel("run", str(job("resumed", 20)))
    assert first_half.returncode == 0, first_half.stderr
    second_half = run_caramel("run", str(job("resumed", 30, rate="0.5")))
    assert second_half.returncode == 0, second_half.stderr
    assert re.search(r"restored .*ckpt-20 at step 20", second_half.stderr), second_half.stderr
    # Progress is reported once per execution of several steps: the resumed run's first line
    # names a step past the checkpoint's, where a run started over would name one of its first.
    first_report = next(report for report in map(parse_report, second_half.stderr.splitlines()) if report)
    assert 20 < first_report.step < 30, second_half.stderr

    expected = checkpoint_weights(tmp_path / "straight")
    resumed = checkpoint_weights(tmp_path / "resumed")
    assert expected.keys() == resumed.keys() and len(expected) >= 6
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)

    # Restored at its last step, a gang has nothing left to run; it still reports the step it
    # ended at, which is where the operator takes a job's final step from (it wrote no report,
    # and a job that ended at step 120 showed STEP 36).
    again = run_caramel("run", str(job("resumed", 30)))
    assert again.returncode == 0, again.stderr
    reports = [report for report in map(parse_report, again.stderr.splitlines()) if report]
    assert [(r.step, r.final, r.timed) for r in reports] == [(30, True, False)], again.stderr
    assert "steps 30/30   none left to run: resumed from a checkpoint at step 30" in again.stderr


@pytest.mark.recovery
@pytest.mark.timeout(600)
def test_a_lost_worker_shrinks_the_gang_which_resumes_from_its_checkpoint_with_the_loss_going_on(tmp_path):
    """spec.workers.minReplicas: a worker the machine kills (SIGKILL, as its out-of-memory killer
    does) is lost; the next gang runs without it, from the latest checkpoint, and trains on."""
    manifest = job_manifest(
        args=["--steps", "600", "--batch-size", "32", "--hidden", "64"],
        workers={"replicas": 3, "minReplicas": 2},
        checkpoint={"path": str(tmp_path / "ckpt"), "intervalSteps": 10},
        runPolicy={"backoffLimit": 1},
    )
    run = BackgroundRun(write_manifest(tmp_path, manifest))
    run.wait_for(re.compile(r"caramel-progress step=([4-9]\d|\d{3,}) "))
    run.training_process(2).send_signal(signal.SIGKILL)
    assert run.finish() == 0, run.output
    before, _, after = run.output.partition("restarting the whole gang")
    assert after.startswith(" (1 of 1, spec.runPolicy.backoffLimit) in 1 s with 2 of 3 workers: worker 2 was lost"), after[:300]
    restored = int(re.search(r"restored \S+ at step (\d+)", after).group(1))
    reports_before = [r for r in map(parse_report, before.splitlines()) if r]
    reports_after = [r for r in map(parse_report, after.splitlines()) if r]
    first, last, resumed = reports_before[0], reports_before[-1], reports_after[0]
    # A checkpoint every 10 steps, at the ends of executions of 4: the latest before the kill, at
    # step 40 or later, is at most 13 steps behind it.
    assert 40 - 13 <= restored < 600, restored
    # The smaller gang goes on from the checkpoint: its first steps follow it, at a loss near the
    # one the whole gang had reached, far below where training began (2.1; a gang started over
    # reports about that). A report's loss is one batch's on rank 0, which varies about twofold
    # between reports at this stage (0.36-0.81 over one run's reports after the restart; a run
    # failed 2x with 0.747 after a last report of 0.337), hence 3x the last report.
    assert restored < resumed.step <= restored + 10
    assert resumed.loss < 0.7 * first.loss and resumed.loss < 3 * last.loss, (first, last, resumed)
    assert reports_after[-1].step == 600 and reports_after[-1].final
    assert sorted(digests(after)) == [0, 1] and len(set(digests(after).values())) == 1
    assert "after 1 whole-gang restart(s), with 2 of 3 workers" in after


def test_slots_run_several_ranks_per_worker(tmp_path):
    manifest = job_manifest(workers={"replicas": 1, "slotsPerWorker": 2})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    assert "1 worker(s) x 2 slot(s) = 2 rank(s)" in result.stderr
    by_rank = digests(result.stderr)
    assert sorted(by_rank) == [0, 1] and by_rank[0] == by_rank[1]


def test_a_command_that_cannot_start_is_reported(tmp_path):
    manifest = job_manifest(script=None, command=["no-such-trainer"], args=[], runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=60)
    assert result.returncode == 1
    assert "cannot start 'no-such-trainer': No such file or directory (check spec.script or spec.command)" in result.stderr


def test_a_script_that_raises_on_every_rank_before_its_first_step_fails_once_quoting_the_error(tmp_path):
    """An unchanged Horovod Keras script raised a ValueError on every rank before its first step,
    and `caramel run` restarted its 2 workers 3 times (1 s, 2 s, 4 s) to raise it again."""
    crash = tmp_path / "crash.py"
    crash.write_text("print('loading data')\nraise ValueError('learning_rate must be positive, got -0.1')\n")
    manifest = job_manifest(script=str(crash), args=[])
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=60)
    assert result.returncode == 1
    assert "restarting the whole gang" not in result.stderr
    assert re.search(
        r"Failed test-job: worker \d exited with code 1: rank \d \| ValueError: learning_rate must be positive, got -0.1; the "
        r"script raised before rank 0's first step, as it would at every restart: the job fails without restarting "
        r"\(spec.runPolicy.restartOnScriptError: true restarts it\) after \d+\.\d s",
        " ".join(result.stderr.split()),  # as rich wrapped it
    ), result.stderr
    assert "loading data" in result.stderr.split("last lines of worker")[1]


def test_a_crashing_script_shows_its_traceback(tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nprint('loading data')\nraise ValueError('bad shard 7')\n")
    manifest = job_manifest(script=str(crash), args=[], runPolicy={"backoffLimit": 1, "restartOnScriptError": True})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=60)
    assert result.returncode == 1
    # As the operator does: the whole gang restarts up to backoffLimit, showing why each time.
    after = result.stderr.split("restarting the whole gang (1 of 1, spec.runPolicy.backoffLimit) in 1 s. Its last lines:\n")[1]
    notice = [line for line in after.splitlines()[:LAST_LINES_KEPT] if line.startswith("  | ")]
    assert any("ValueError: bad shard 7" in line for line in notice), after
    assert "(after 1 restarts: spec.runPolicy.backoffLimit reached)" in result.stderr
    tail = result.stderr.split("last lines of worker")[1]
    assert "ValueError: bad shard 7" in tail and "loading data" in tail


@pytest.mark.recovery
@pytest.mark.timeout(900)
def test_a_killed_worker_restarts_the_gang_which_resumes_from_its_checkpoint(tmp_path):
    """One trial of the worker fault campaign (`python -m testbed.fault_campaigns` runs ten, of
    WorkerCampaign.STEPS steps), on a shorter run: a kill lands between the first checkpoint and
    the run's middle all the same."""
    from testbed.fault_campaigns import WorkerCampaign

    campaign = WorkerCampaign(tmp_path, seed=4, steps=800)
    trial = campaign.trial(0)
    assert trial.ok, trial.detail


@pytest.mark.recovery
@pytest.mark.timeout(300)
def test_worker_0_waits_for_a_peer_that_starts_late(tmp_path):
    """Gloo's rendezvous timeout was its default, 30 s: worker 0 aborted ("Wait timeout after 30
    seconds for key(s): 1", exit 134) whenever a peer started later, as one pending for CPU or
    pulling its image does. The contract's HOROVOD_GLOO_TIMEOUT_SECONDS lets it wait."""
    late_rank_1 = (
        "import os, runpy, sys, time\n"
        f"time.sleep({LATE_SECONDS} if os.environ['HOROVOD_RANK'] == '1' else 0)\n"
        f"sys.argv = ['train_small.py', '--steps', '4', '--batch-size', '16', '--hidden', '16']\n"
        f"runpy.run_path({str(SMALL_EXAMPLE)!r}, run_name='__main__')\n"
    )
    manifest = job_manifest(script=None, command=[sys.executable, "-c", late_rank_1], args=[], runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    assert "Wait timeout" not in result.stderr
    assert sorted(digests(result.stderr)) == [0, 1]


# Longer than Gloo's default timeout of 30 s.
LATE_SECONDS = 40
