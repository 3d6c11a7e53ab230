"""A benchmark worker's record of one step as TensorFlow ran it: what `step_timeline.py` reads.

    --worker-env CARAMEL_BENCH_TRACE=<directory>:<step>

Each run writes into <directory>/<strategy>-<api> (its worker's --strategy and --api). Rank 0 runs the first execution that starts at or after step <step> (counted from the first step
of the run, warm-up included; a per-step loop's execution is one step) under TensorFlow's profiler, with every op traced (host tracer level 3),
and keeps the optimized graphs TensorFlow ran (graph collection, from the start of the run: a
function's graphs are kept when it is first run). It writes there:
    profile/...xplane.pb   every op's start and end on one clock, the emulated kernels among them
    graphs.pb              the partition graphs, a `GraphDef` each in a `RunMetadata`
The profiler costs CPU in the traced execution: a traced run is for the timeline, not for its
step times.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context

TRACE_VARIABLE = "CARAMEL_BENCH_TRACE"
GRAPHS_FILE = "graphs.pb"
PROFILE_DIRECTORY = "profile"


@dataclass
class StepTrace:
    directory: Path
    step: int
    """The first execution starting at or after this step (1-based over the whole run) is traced."""
    _tracing: bool = False
    _done: bool = False

    @classmethod
    def from_env(cls, rank: int, run: str) -> StepTrace | None:
        """Rank 0's trace of this `run` (its strategy and API), where CARAMEL_BENCH_TRACE asks for one."""
        setting = os.environ.get(TRACE_VARIABLE)
        if not setting or rank != 0:
            return None
        directory, _, step = setting.rpartition(":")
        if not directory or not step.isdigit() or int(step) < 1:
            raise ValueError(f"{TRACE_VARIABLE}={setting!r}: expected <directory>:<step>, the step a number from 1")
        trace = cls(Path(directory) / run, int(step))
        trace.directory.mkdir(parents=True, exist_ok=True)
        context.context().enable_graph_collection()
        return trace

    def steps_done(self, count: int) -> None:
        """`count` steps have ended: start the profiler before the traced execution, stop it after."""
        if self._done:
            return
        if not self._tracing and count >= self.step - 1:
            options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3, python_tracer_level=0, device_tracer_level=0)
            tf.profiler.experimental.start(str(self.directory / PROFILE_DIRECTORY), options=options)
            self._tracing = True
        elif self._tracing:
            tf.profiler.experimental.stop()
            metadata = config_pb2.RunMetadata()
            for function in context.context().export_run_metadata().function_graphs:
                metadata.partition_graphs.extend(function.partition_graphs)
            (self.directory / GRAPHS_FILE).write_bytes(metadata.SerializeToString())
            context.context().disable_graph_collection()
            self._tracing, self._done = False, True
