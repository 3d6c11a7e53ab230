"""What the benchmark's workers report of their CPU time (`benchmarks.worker_events`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from benchmarks import worker_events

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def cpu_clock(monkeypatch):
    """The process's CPU seconds as the test sets them; rank 1, so that no step is printed."""
    clock = {"seconds": 0.0}
    monkeypatch.setattr(worker_events, "cpu_seconds", lambda: clock["seconds"])
    monkeypatch.setattr(worker_events, "rank", lambda: 1)
    return clock


def test_cpu_per_step_counts_the_measured_steps_and_not_what_follows_them(cpu_clock):
    times = worker_events.StepLog(warmup=4)
    cpu_clock["seconds"] = 10.0  # the warm-up execution (tracing included)
    times.append(1.0, steps=4)
    for _ in range(3):
        cpu_clock["seconds"] += 2.0  # 0.5 s per step
        times.append(1.0, steps=4)
    cpu_clock["seconds"] += 6.0  # once, after training: a checkpoint, the weights check
    assert times.cpu_seconds_per_step() == pytest.approx(0.5)


def test_cpu_per_step_is_unknown_until_a_step_was_measured(cpu_clock):
    times = worker_events.StepLog(warmup=4)
    times.append(1.0, steps=4)
    assert times.cpu_seconds_per_step() != times.cpu_seconds_per_step()  # NaN
    without_warmup = worker_events.StepLog(warmup=0)
    cpu_clock["seconds"] = 3.0
    without_warmup.append(1.0, steps=2)
    assert without_warmup.cpu_seconds_per_step() == pytest.approx(1.5)


def test_the_tensor_peak_is_tensorflows_count_of_live_bytes():
    """Real TensorFlow, in this process: oneDNN's allocator (the default here) counts; a 4 MiB
    tensor alive at once shows in the peak."""
    held = tf.ones([1024, 1024])
    peak = worker_events.tensor_peak_bytes()
    if peak is None:
        pytest.skip("this TensorFlow's CPU allocator keeps no count (oneDNN off)")
    assert peak >= held.shape.num_elements() * 4


def test_no_tensor_peak_where_the_allocator_keeps_no_count():
    """oneDNN's allocator handing every buffer to the system allocator counts nothing: the peak
    is unknown, not 0. Its own process, because TensorFlow reads the setting once."""
    probe = "import tensorflow as tf; from benchmarks import worker_events; held = tf.ones([1024, 1024]); print(worker_events.tensor_peak_bytes())"
    env = {**os.environ, "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True, cwd=REPOSITORY)
    assert result.stdout.strip().splitlines()[-1] == "None"


def test_time_in_the_garbage_collector_counts_the_measured_steps_only(cpu_clock):
    import gc

    times = worker_events.StepLog(warmup=4)
    gc.collect()  # during the warm-up: not counted
    times.append(1.0, steps=4)
    assert times.collector_seconds_per_step() != times.collector_seconds_per_step()  # NaN: nothing measured yet
    for _ in range(3):
        gc.collect()
        times.append(1.0, steps=4)
    measured = times.collector_seconds_per_step()
    assert measured > 0
    gc.collect()  # after the last step: not counted
    assert times.collector_seconds_per_step() == measured
