"""Horovod's cycle time, chosen once from the measured step.

Horovod's background thread wakes every HOROVOD_CYCLE_TIME (1 ms by default) and, with its
response cache on, runs a collective with every rank to agree on what is ready, whether anything
is or not: four idle ranks on two cores spent 0.06-0.13 CPU seconds per second each on it. A
transfer enqueued while the thread sleeps waits for the next wake-up; one enqueued while it
works waits for nothing, since the next cycle starts as soon as the work is done. So a longer
cycle delays only a transfer that finds the link idle, by half a cycle on average, and saves the
wake-ups of every idle millisecond. Measured with 4 ranks on 2 cores: 5 ms cycles made the
quickstart's 8 ms step about 30% longer, and saved 9% of each rank's CPU on the 2.7 s step of the
emulated BERT-base (loopback).

The step's length is known only once steps ran, and Horovod reads its cycle time when it
starts. So at the first boundary where the step was measured, rank 0 picks a cycle of
CYCLE_SHARE_OF_STEP of its step (between Horovod's 1 ms and MAX_CYCLE_MS), and if that is at
least MIN_RESTART_CYCLE_MS, every rank restarts Horovod with it (`hvd.shutdown`, `hvd.init`:
Horovod's Gloo rendezvous clears each scope once every rank has joined, so it serves a second
start). Between executions no collective is in flight, and the Horovod ops of graphs already
traced hand their tensors to whichever Horovod runs. The restart took 0.26-0.32 s on 4 local
ranks. A job that sets HOROVOD_CYCLE_TIME itself keeps it, and Horovod is never restarted.
"""

from __future__ import annotations

import math
import os
import sys
import time

import horovod.tensorflow as hvd
import tensorflow as tf

CYCLE_TIME_VARIABLE = "HOROVOD_CYCLE_TIME"
HOROVOD_DEFAULT_CYCLE_MS = 1.0
# A cycle of this share of the step delays the few transfers per step that find the link idle by
# a few thousandths of the step at most.
CYCLE_SHARE_OF_STEP = 0.002
MAX_CYCLE_MS = 10.0
# Below this a restart (a second Gloo rendezvous, about 0.3 s) buys too few idle wake-ups.
MIN_RESTART_CYCLE_MS = 2.0


def cycle_ms_for_step(seconds_per_step: float) -> float:
    """The cycle time for steps of this length, in milliseconds."""
    return min(MAX_CYCLE_MS, max(HOROVOD_DEFAULT_CYCLE_MS, round(CYCLE_SHARE_OF_STEP * seconds_per_step * 1e3, 1)))


def job_cycle_ms() -> float:
    """The cycle the job set in HOROVOD_CYCLE_TIME, in milliseconds."""
    value = os.environ[CYCLE_TIME_VARIABLE]
    try:
        cycle_ms = float(value)
    except ValueError:
        cycle_ms = math.nan
    if not cycle_ms > 0:
        raise ValueError(f"{CYCLE_TIME_VARIABLE} (spec.env): expected milliseconds above 0, got {value!r}")
    return cycle_ms


class CycleTuner:
    """Restarts Horovod once, on every rank at the same boundary, with a cycle fit for the step."""

    def __init__(self) -> None:
        self.done = CYCLE_TIME_VARIABLE in os.environ
        """Whether the cycle is settled: the job set it, or it was chosen."""
        self.cycle_ms = job_cycle_ms() if self.done else HOROVOD_DEFAULT_CYCLE_MS

    def at_boundary(self, seconds_per_step: float | None) -> None:
        """Between executions, on every rank at the same step count, once the step was measured
        (`seconds_per_step` on this rank; rank 0's decides)."""
        if self.done or seconds_per_step is None:
            return
        self.done = True
        chosen = cycle_ms_for_step(seconds_per_step)
        chosen = float(hvd.broadcast(tf.constant(chosen, tf.float64), root_rank=0, name="caramel_cycle_time").numpy())
        if chosen < MIN_RESTART_CYCLE_MS:
            return
        started = time.perf_counter()
        os.environ[CYCLE_TIME_VARIABLE] = f"{chosen:g}"
        hvd.shutdown()
        hvd.init()
        self.cycle_ms = chosen
        if hvd.rank() == 0:
            print(
                f"caramel: Horovod restarted with a cycle of {chosen:g} ms for steps of {seconds_per_step * 1e3:.4g} ms "
                f"(in {time.perf_counter() - started:.2g} s; set {CYCLE_TIME_VARIABLE} in spec.env to choose it)",
                file=sys.stderr, flush=True,
            )  # fmt: skip
