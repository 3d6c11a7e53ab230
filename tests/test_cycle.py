"""Horovod's cycle time, chosen from the measured step (`caramel.tensorflow.cycle`)."""

from __future__ import annotations

import json
import sys

import pytest

from caramel.tensorflow import cycle
from conftest import job_manifest, run_caramel, write_manifest


@pytest.mark.parametrize(
    ("seconds_per_step", "cycle_ms"),
    [(0.009, 1.0), (0.75, 1.5), (1.1, 2.2), (3.1, 6.2), (60.0, cycle.MAX_CYCLE_MS)],
)
def test_the_cycle_is_a_small_share_of_the_step_within_horovods_default_and_the_longest(seconds_per_step, cycle_ms):
    assert cycle.cycle_ms_for_step(seconds_per_step) == pytest.approx(cycle_ms)


def test_a_cycle_the_job_set_is_kept(monkeypatch):
    monkeypatch.setenv(cycle.CYCLE_TIME_VARIABLE, "3")
    tuner = cycle.CycleTuner()
    tuner.at_boundary(10.0)  # would choose 10 ms; returns before any collective
    assert tuner.done and tuner.cycle_ms == 3.0


@pytest.mark.parametrize("value", ["fast", "0", "-1", "nan"])
def test_a_cycle_that_is_not_a_positive_number_of_milliseconds_is_refused(monkeypatch, value):
    monkeypatch.setenv(cycle.CYCLE_TIME_VARIABLE, value)
    with pytest.raises(ValueError, match=r"HOROVOD_CYCLE_TIME \(spec.env\): expected milliseconds above 0, got"):
        cycle.CycleTuner()


@pytest.mark.e2e
def test_horovod_restarted_with_a_longer_cycle_between_executions_trains_on(tmp_path):
    manifest = job_manifest(script=None, command=[sys.executable, "-m", "testbed.cycle_worker"], args=[])
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    assert f"Horovod restarted with a cycle of {cycle.MAX_CYCLE_MS:g} ms" in result.stderr, result.stderr
    reports = [json.loads(line.split("| ", 1)[1]) for line in result.stderr.splitlines() if '"same_weights"' in line]
    assert reports == [{"cycle_ms": cycle.MAX_CYCLE_MS, "environment": f"{cycle.MAX_CYCLE_MS:g}", "same_weights": True}] * 2, result.stderr
