"""The benchmark's emulated worker runs every public path it measures to the end, with real
Horovod ranks under `caramel run`, and prints its summary: a zoo run that breaks on one path
loses hours of measurements, so each path is run here for a few steps (the device is made fast,
so the steps are short; nothing is timed)."""

from __future__ import annotations

import json
import sys

import pytest

from caramel.planner.rounds import settled_step
from conftest import job_manifest, run_caramel, write_manifest

pytestmark = pytest.mark.e2e

RANKS = 2


@pytest.mark.parametrize(("strategy", "api"), [("caramel", "tape"), ("caramel", "function"), ("caramel", "fit"), ("horovod", "tape")])
def test_every_path_runs_to_its_summary(tmp_path, strategy, api):
    command = [
        sys.executable, "-m", "benchmarks.emulated_worker", "--profile", "mobilenet_v2", "--device-tflops", "1000",
        "--strategy", strategy, "--api", api, "--steps", "4", "--warmup", "6", "--steps-per-execution", "2",
    ]  # fmt: skip
    manifest = job_manifest(script=None, command=command, args=[], workers={"replicas": RANKS})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line[line.index("{") :]) for line in result.stderr.splitlines() if '{"event": ' in line]
    summaries = [event for event in events if event["event"] == "summary"]
    assert len(summaries) == RANKS and all(summary["strategy"] == strategy for summary in summaries), result.stderr[-3000:]
    assert len([event for event in events if event["event"] == "step"]) == 4, result.stderr[-3000:]  # rank 0's measured steps


@pytest.mark.parametrize("api", ["function", "fit"])
def test_caramels_graph_is_measured_against_horovods_own_and_the_faster_kept(tmp_path, api):
    """Past its first rounds (`settled_step`), a Caramel step function has run blocks of its graph
    of several steps and of Horovod's own graph of one step, timed both, and runs the one chosen."""
    spe = 2
    command = [
        sys.executable, "-m", "benchmarks.emulated_worker", "--profile", "mobilenet_v2", "--device-tflops", "1000",
        "--strategy", "caramel", "--api", api, "--steps", "4", "--warmup", str(settled_step(spe)),
        "--steps-per-execution", str(spe),
    ]  # fmt: skip
    manifest = job_manifest(script=None, command=command, args=[], workers={"replicas": RANKS})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(line[line.index("{") :]) for line in result.stderr.splitlines() if '{"event": "summary"' in line]
    assert len(summaries) == RANKS, result.stderr[-3000:]
    for summary in summaries:
        assert set(summary["graph_step_seconds"]) == {"caramel", "horovod"}, summary
        assert all(seconds > 0 for seconds in summary["graph_step_seconds"].values()), summary
    assert len({summary["graph"] for summary in summaries}) == 1, summaries  # every rank runs rank 0's choice
    assert "steps run Caramel's graph of several steps" in result.stderr or "steps run Horovod's own graph of one step" in result.stderr
