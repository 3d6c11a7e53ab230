"""The benchmark's emulated worker runs every public path it measures to the end, with real ranks
under `caramel run`, and prints its summary: a zoo run that breaks on one path loses hours of
measurements, so each path is run here for a few steps (the device is made fast, so the steps are
short; nothing is timed): Caramel's paths (each API, each backend), and the baselines, each library
through its own API (plain Horovod past Caramel's horovod package, MultiWorkerMirroredStrategy)."""

from __future__ import annotations

import json
import sys

import pytest

from caramel.planner.rounds import settled_step
from conftest import job_manifest, run_caramel, write_manifest
from testbed.lab import lab_variables

pytestmark = pytest.mark.e2e

RANKS = 2
STEPS_PER_EXECUTION = 2


def run_worker(tmp_path, strategy: str, api: str, warmup: int, caramel: dict | None = None, timeout: float = 600) -> tuple[list[dict], str]:
    command = [
        sys.executable, "-m", "benchmarks.emulated_worker", "--profile", "mobilenet_v2", "--device-tflops", "1000",
        "--strategy", strategy, "--api", api, "--steps", "4", "--warmup", str(warmup), "--steps-per-execution", str(STEPS_PER_EXECUTION),
    ]  # fmt: skip
    # The run stands for a long training's steady state, as the benchmark's: the first plan's search is waited for.
    env = [{"name": name, "value": value} for name, value in lab_variables(first_plan_waits=True).items()]
    manifest = job_manifest(script=None, command=command, args=[], workers={"replicas": RANKS}, caramel=caramel or {}, env=env)
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line[line.index("{") :]) for line in result.stderr.splitlines() if '{"event": ' in line]
    return events, result.stderr


# These paths run past their first rounds (`settled_step`), for the graph choice's test; the
# same run is every path's test on them, so that each path's job runs once.
SETTLED_PATHS = [("function", "tensorflow"), ("fit", "horovod")]
# xdist hands a group's tests to one worker, which runs the module's shared jobs once (make test: --dist loadgroup).
shares_runs = pytest.mark.xdist_group("emulated-worker-caramel-paths")


@pytest.fixture(scope="module")
def caramel_run(tmp_path_factory):
    """The events and standard error of the Caramel path `api` on `backend`, run once per module."""
    runs: dict[tuple[str, str], tuple[list[dict], str]] = {}

    def run(api: str, backend: str) -> tuple[list[dict], str]:
        if (api, backend) not in runs:
            settled = (api, backend) in SETTLED_PATHS
            warmup = settled_step(STEPS_PER_EXECUTION) if settled else 6
            directory = tmp_path_factory.mktemp(f"{api}-{backend}")
            runs[api, backend] = run_worker(directory, "caramel", api, warmup, {"backend": backend}, timeout=900 if settled else 600)
        return runs[api, backend]

    return run


# Each API the worker measures and each backend, not every pair: the worker's code for an API is
# the same on both backends, and tests/tensorflow/test_correctness.py runs every pair through real training.
CARAMEL_PATHS = [("tape", "horovod"), ("fit-plain", "horovod"), *SETTLED_PATHS]


@shares_runs
@pytest.mark.parametrize(("api", "backend"), CARAMEL_PATHS)
def test_every_caramel_path_and_backend_runs_to_its_summary(caramel_run, api, backend):
    events, stderr = caramel_run(api, backend)
    summaries = [event for event in events if event["event"] == "summary"]
    assert len(summaries) == RANKS and all(summary["strategy"] == "caramel" for summary in summaries), stderr[-3000:]
    assert all(summary["backend"] == backend for summary in summaries), summaries
    assert len([event for event in events if event["event"] == "step"]) == 4, stderr[-3000:]  # rank 0's measured steps


@shares_runs
def test_a_fit_compiled_without_steps_per_execution_runs_several_steps_per_graph(caramel_run):
    """As Horovod's Keras examples compile: the worker's own step log acts per execution, so Caramel
    runs the most steps per graph, up to 4, that divide the fit's 10 steps."""
    _, stderr = caramel_run("fit-plain", "horovod")
    assert "2 steps per graph (compile gave steps_per_execution 1" in stderr, stderr[-3000:]


@pytest.mark.parametrize(
    ("strategy", "api"),
    [("horovod", "tape"), ("mwms", "fit"), ("mwms", "tape"), ("compute-only", "fit"), ("comm-only", "fit"), ("comm-only-tf", "fit")],
)
def test_every_baseline_runs_to_its_summary(tmp_path, strategy, api):
    events, stderr = run_worker(tmp_path, strategy, api, 2)
    summaries = [event for event in events if event["event"] == "summary"]
    assert len(summaries) == RANKS and all(summary["strategy"] == strategy for summary in summaries), stderr[-3000:]
    assert "backend" not in summaries[0]  # Caramel's runtime was not started
    assert len([event for event in events if event["event"] == "step"]) == 4, stderr[-3000:]
    if strategy in ("horovod", "comm-only"):
        # Plain Horovod, not Caramel's horovod package (which would check the weights at exit).
        assert "caramel:" not in stderr, stderr[-3000:]


@shares_runs
@pytest.mark.parametrize(("api", "backend"), SETTLED_PATHS)
def test_caramels_graph_is_measured_against_the_backends_own_and_the_faster_kept(caramel_run, api, backend):
    """Past its first rounds (`settled_step`), a Caramel step function has run blocks of its graph
    of several steps and of the backend's own graph of one step, timed both, and runs the one chosen."""
    events, stderr = caramel_run(api, backend)
    summaries = [event for event in events if event["event"] == "summary"]
    assert len(summaries) == RANKS, stderr[-3000:]
    for summary in summaries:
        assert set(summary["graph_step_seconds"]) == {"caramel", "own"}, summary
        assert all(seconds > 0 for seconds in summary["graph_step_seconds"].values()), summary
    assert len({summary["graph"] for summary in summaries}) == 1, summaries  # every rank runs rank 0's choice
    assert "steps run Caramel's graph of several steps" in stderr or "in a graph of one step" in stderr
