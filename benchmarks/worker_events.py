"""What benchmark workers print, as JSON lines the driver (scheduling_bench.py) reads.

Rank 0 prints `{"event": "step", "step", "seconds"}` as each measured step ends (the driver
watches them live, for rate drops); every rank ends with one `{"event": "summary", "rank",
"strategy", "peak_rss_bytes", ...}` line.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.tensorflow.engine import TransferEngine


class StepLog:
    """Counts steps; rank 0 prints every measured one as it ends."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.count = 0

    def append(self, seconds: float) -> None:
        self.count += 1
        if hvd.rank() == 0 and self.count > self.warmup:
            print(json.dumps({"event": "step", "step": self.count - self.warmup, "seconds": seconds}), flush=True)


def print_summary(strategy: str, details: dict) -> None:
    summary = {
        "event": "summary",
        "rank": hvd.rank(),
        "strategy": strategy,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **details,
    }
    print(json.dumps(summary), flush=True)


def engine_details(engine: TransferEngine, exposed_wait_seconds: float) -> dict:
    """What Caramel's engine reports about its plan and link at the end of a run."""
    plan = engine.plan
    return {
        "transfers_per_step": len(plan.transfers),
        "max_bucket_bytes": plan.batch.max_bytes,
        "min_bucket_bytes": plan.batch.min_bytes,
        "deadline_span_seconds": plan.batch.deadline_span_seconds,
        "predicted_step_seconds": plan.predicted_step_seconds,
        "alpha_seconds": engine.link.alpha,
        "bytes_per_second": engine.link.bytes_per_second,
        "plan_changes": engine.plan_changes,
        "exposed_wait_seconds": exposed_wait_seconds,
    }


class HorovodReducers:
    """Horovod's allreduce of each gradient, callable from many threads at once.

    One graph function per tensor: in a graph Horovod names each request after the tensor, so
    requests from many threads are told apart (eager requests all share the op's name).
    """

    def __init__(self, count: int) -> None:
        self._functions = [
            tf.function(lambda gradient, index=index: hvd.allreduce(gradient, op=hvd.Average, name=f"gradient_{index}"))
            for index in range(count)
        ]
        self.pool = ThreadPoolExecutor(max_workers=count)

    def submit(self, index: int, gradient: tf.Tensor):
        """A future of (index, the average of gradient over all ranks)."""
        return self.pool.submit(lambda: (index, self._functions[index](gradient)))


def allreduce_all_at_once(gradients: Sequence[tf.Tensor], steps: int, times: StepLog) -> None:
    """comm-only: every gradient handed to Horovod at once, last layer first, steps times."""
    reducers = HorovodReducers(len(gradients))
    with reducers.pool:
        for _ in range(steps):
            started = time.perf_counter()
            wait([reducers.submit(index, gradients[index]) for index in reversed(range(len(gradients)))])
            times.append(time.perf_counter() - started)
