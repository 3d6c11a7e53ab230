"""What benchmark workers print, as JSON lines the driver (scheduling_bench.py) reads, and the
parts both workers share.

Rank 0 prints `{"event": "step", "step", "seconds"}` as each measured step ends (the driver
watches them live, for rate drops); every rank ends with one `{"event": "summary", "rank",
"strategy", "peak_rss_bytes", ...}` line. A worker's rank is the worker contract's (HOROVOD_RANK),
whichever library trains: plain Horovod, MultiWorkerMirroredStrategy or Caramel on either backend.
"""

from __future__ import annotations

import gc
import json
import resource
import statistics
import time
from collections.abc import Sequence
from types import ModuleType

import tensorflow as tf

from benchmarks.step_trace import StepTrace
from caramel.contract.env import WorkerContract
from caramel.tensorflow import runtime
from caramel.tensorflow.keras_version import steps_per_execution


def rank() -> int:
    """This training process's rank in the job (the worker contract's)."""
    return WorkerContract.from_env().required_rank


def cpu_seconds() -> float:
    """CPU time this process has used, user and system, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CollectorClock:
    """Wall time this process has spent in Python's cyclic garbage collector: each collection
    stops the thread that triggered it, and a full one walks every object, a traced graph's too."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


class StepLog:
    """Counts steps; rank 0 prints every measured one as it ends, and traces one where
    CARAMEL_BENCH_TRACE asks (step_trace.py; `run` names the trace). Steps of one graph execution
    share its time equally. The CPU time of the measured steps is kept for the summary: from the
    end of the warm-up to the end of the last step, so what a strategy does once at the end of
    training (Caramel's weights check hashes every weight) is not spread over the steps."""

    def __init__(self, warmup: int, run: str = "run") -> None:
        self.warmup = warmup
        self.count = 0
        self.rank = rank()
        self._trace = StepTrace.from_env(self.rank, run)
        self._cpu_at_warmup_end = cpu_seconds() if warmup == 0 else None
        self._cpu_at_last_step: float | None = None
        self._collector = CollectorClock()
        self._collector_at_warmup_end = 0.0
        self._collector_at_last_step = 0.0

    def append(self, seconds: float, steps: int = 1) -> None:
        for _ in range(steps):
            self.count += 1
            if self.rank == 0 and self.count > self.warmup:
                print(json.dumps({"event": "step", "step": self.count - self.warmup, "seconds": seconds / steps}), flush=True)
        if self._trace is not None:
            self._trace.steps_done(self.count)
        if self._cpu_at_warmup_end is None and self.count >= self.warmup:
            self._cpu_at_warmup_end, self._collector_at_warmup_end = cpu_seconds(), self._collector.seconds
        elif self.count > self.warmup:
            self._cpu_at_last_step, self._collector_at_last_step = cpu_seconds(), self._collector.seconds

    def cpu_seconds_per_step(self) -> float:
        """CPU seconds per measured step (from the first execution that ended after the warm-up to
        the end of the last)."""
        measured = self.count - self.warmup
        if self._cpu_at_warmup_end is None or self._cpu_at_last_step is None or measured <= 0:
            return float("nan")
        return (self._cpu_at_last_step - self._cpu_at_warmup_end) / measured

    def collector_seconds_per_step(self) -> float:
        """Seconds in Python's garbage collector per measured step (over the same steps)."""
        measured = self.count - self.warmup
        if self._cpu_at_warmup_end is None or self._cpu_at_last_step is None or measured <= 0:
            return float("nan")
        return (self._collector_at_last_step - self._collector_at_warmup_end) / measured


class StepLogCallback(tf.keras.callbacks.Callback):
    """Times each execution of `model.fit` (the model's steps per execution, as the fit runs them:
    Caramel may run several where `compile` gave one) into a StepLog."""

    observes_single_batches = False
    """It times executions, whatever their steps (caramel.tensorflow.fit_steps reads this)."""

    def __init__(self, times: StepLog) -> None:
        super().__init__()
        self.times = times
        self._started = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.times.append(time.perf_counter() - self._started, steps_per_execution(self.model))


def tensor_peak_bytes() -> int | None:
    """The most bytes TensorFlow's CPU allocator held at once (live tensors), where it keeps
    count: its oneDNN allocator, TensorFlow's default on x86, does; the plain one
    (TF_ENABLE_ONEDNN_OPTS=0) raises, and oneDNN's with TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 says 0
    (a worker that trained has held tensors)."""
    try:
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    except ValueError:
        return None
    return peak or None


def print_summary(strategy: str, times: StepLog, details: dict) -> None:
    summary = {
        "event": "summary",
        "rank": rank(),
        "strategy": strategy,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "tensor_peak_bytes": tensor_peak_bytes(),
        "cpu_seconds_per_step": times.cpu_seconds_per_step(),
        "collector_seconds_per_step": times.collector_seconds_per_step(),
        **details,
    }
    print(json.dumps(summary), flush=True)


def caramel_details() -> dict:
    """What Caramel's replanner reports about its plan and link at the end of a run (no plan
    where the steps ran the backend's own way alone: a tf.function per step)."""
    caramel = runtime.current()
    communicator = caramel.communicator
    replanner = communicator.control.replanner
    plan = replanner.plan
    recent = replanner.recent_steps
    planned = {
        "transfers_per_step": len(plan.transfers),
        "max_bucket_bytes": plan.batch.max_bytes,
        "min_bucket_bytes": plan.batch.min_bytes,
        "deadline_span_seconds": plan.batch.deadline_span_seconds,
        "predicted_step_seconds": plan.predicted_step_seconds,
        "plan_bytes_per_second": replanner.plan_link.bytes_per_second,  # the link the prediction was made for
    } if plan else {}  # fmt: skip
    return {
        "backend": caramel.backend.name,
        "allreduce": communicator.algorithm,
        "exposed_seconds_per_step": statistics.fmean(step.exposed_seconds for step in recent) if recent else None,
        "communication_seconds_per_step": statistics.fmean(step.communication_seconds for step in recent) if recent else None,
        **planned,
        "alpha_seconds": replanner.link.alpha,
        "bytes_per_second": replanner.link.bytes_per_second,
        "plan_changes": replanner.plan_changes,
        "planned": communicator.runs_plan if plan else None,  # None: no plan was made (a per-step path)
        "graph": communicator.control.graphs.running,
        # What the last round between Caramel's graph and the backend's own graph of one step measured, per
        # step (graph_choice.py's CARAMEL and OWN_GRAPH).
        "graph_step_seconds": communicator.control.graphs.means,
        "arm_decisions": int(communicator.control.selector.decisions.numpy()),
        # What the last round of the selector measured, per step: each arm's mean.
        "own_way_step_seconds": float(communicator.control.selector.means.numpy()[0]) or None,
        "planned_step_seconds": float(communicator.control.selector.means.numpy()[1]) or None,
    }


def allreduce_all_at_once(hvd: ModuleType, tensors: Sequence[tf.Tensor], steps: int, times: StepLog) -> None:
    """comm-only: every tensor handed to plain Horovod (`hvd`, initialised) at once, last first (as
    backpropagation produces them), `steps` times; Horovod fuses and reduces them with its
    defaults. This M calibrated the zoo's operating points (zoo_points.json)."""

    @tf.function
    def reduce_all(gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        return [hvd.allreduce(tensor, op=hvd.Average, name=f"gradient_{i}") for i, tensor in reversed(list(enumerate(gradients)))]

    # Passed as arguments, not captured: a graph could fold constants it captured.
    gradients = list(tensors)
    for _ in range(steps):
        started = time.perf_counter()
        reduce_all(gradients)
        times.append(time.perf_counter() - started)


def allreduce_all_at_once_tf(strategy: tf.distribute.Strategy, tensors: Sequence[tf.Tensor], steps: int, times: StepLog) -> None:
    """comm-only-tf: every tensor averaged at once by MultiWorkerMirroredStrategy over TensorFlow's
    collectives (reversed and packed into one all-reduce per dtype, as it averages a step's
    gradients), `steps` times: TensorFlow's M."""
    from benchmarks.mwms import all_reduce

    @tf.function
    def reduce_all(gradients: list[tf.Tensor]) -> object:
        return all_reduce(strategy, gradients)

    gradients = list(tensors)  # arguments, not captures: nothing to fold
    for _ in range(steps):
        started = time.perf_counter()
        reduce_all(gradients)  # a function call returns once its outputs exist
        times.append(time.perf_counter() - started)
