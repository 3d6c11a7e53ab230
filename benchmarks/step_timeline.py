"""One step on one time axis: when each gradient became ready, when its transfer entered the
backend, and when it finished, from a traced benchmark run (step_trace.py).

    python -m benchmarks.zoo_bench --profiles densenet121 --rates 1000 --repeats 1 --strategies horovod-tape \\
        --worker-env CARAMEL_BENCH_TRACE=/tmp/trace:49
    python -m benchmarks.step_timeline /tmp/trace [--plot timeline.png]

The emulated model's backward kernels are ops named `layer_<i>_backward` (emulated_model.py); a
layer's gradients exist when its kernel's op ends (they are its weights' values, read once the
kernel ran). Every collective of the traced graphs that carries gradients (a backward kernel of
its step is an input of it or of one of its ancestors by data edges) is a transfer:
    ready     when the last of the gradients it carries was ready (its layers' kernels ended)
    entered   when its op started: the backend had it (Horovod's ops are asynchronous: the op
              hands the tensors to Horovod's background thread; TensorFlow's start the ring)
    finished  when the op completed (its asynchronous done callback), or where the profile has
              no such event, when the first op that reads its output started
    held      entered - ready: how long it waited, once its gradients existed, for something else
All in milliseconds from the start of the traced execution's first backward kernel. A graph of
several steps prints one table per step (its ops' names start with caramel_step_<k>/).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from tensorflow.core.protobuf import config_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks.step_trace import GRAPHS_FILE, PROFILE_DIRECTORY

COLLECTIVES = ("HorovodAllreduce", "HorovodGroupedAllreduce", "CollectiveReduceV2")
BACKWARD = re.compile(r"(?:^|/)layer_(\d+)_backward$")
FORWARD = re.compile(r"(?:^|/)layer_(\d+)_forward$")
# Ops that join tensors into one a collective carries (TensorFlow's backend fuses a bucket).
JOINS = ("ConcatV2", "Concat", "Pack")
STEP_COPY = re.compile(r"^(caramel_step_\d+/)")
PICOSECONDS = 1e-12
ASYNC_START, ASYNC_DONE = "ExecutorState::ProcessAsync::Start", "ExecutorState::ProcessAsync::Done"


@dataclass(frozen=True)
class Span:
    start: float
    end: float


@dataclass(frozen=True)
class Transfer:
    name: str
    copy: str
    layers: tuple[int, ...]
    ready: float
    entered: float
    finished: float

    needed: float = float("nan")
    """When the next step's forward kernel of the first layer it carries started (nan where the
    next step is not in the traced graph)."""

    @property
    def held(self) -> float:
        return self.entered - self.ready


def op_spans(profile_directory: Path) -> dict[str, list[Span]]:
    """Every op's run on the host plane, by node name, in seconds on the profiler's clock. An
    ordinary op's event is named `node:type`; an asynchronous one (Horovod's, TensorFlow's
    collectives) is an `ExecutorState::ProcessAsync::Start` event when it starts and an
    `ExecutorState::ProcessAsync::Done` event when it completes, naming the node in a stat."""
    files = sorted(profile_directory.glob("plugins/profile/*/*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"no profile in {profile_directory}: did the traced step run (CARAMEL_BENCH_TRACE)?")
    space = xplane_pb2.XSpace()
    space.ParseFromString(files[-1].read_bytes())
    spans: dict[str, list[Span]] = defaultdict(list)
    async_started: dict[str, list[float]] = defaultdict(list)
    async_done: dict[str, list[float]] = defaultdict(list)
    for plane in space.planes:
        name_stat = next((key for key, stat in plane.stat_metadata.items() if stat.name == "name"), None)
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                start = (line.timestamp_ns * 1000 + event.offset_ps) * PICOSECONDS
                if name in (ASYNC_START, ASYNC_DONE):
                    ref = next((stat.ref_value for stat in event.stats if stat.metadata_id == name_stat), None)
                    if ref is not None:
                        (async_started if name == ASYNC_START else async_done)[plane.stat_metadata[ref].name].append(start)
                    continue
                node, _, op_type = name.rpartition(":")
                if node and op_type:
                    spans[node].append(Span(start, start + event.duration_ps * PICOSECONDS))
    for node, starts in async_started.items():
        ends = sorted(async_done.get(node, []))
        spans[node] = [Span(begun, next((end for end in ends if end >= begun), float("nan"))) for begun in sorted(starts)]
    return spans


def transfers(graphs: list, spans: dict[str, list[Span]]) -> list[Transfer]:
    """The traced graphs' collectives that carry gradients, and when they ran."""
    found = []
    for graph in graphs:
        nodes = {node.name: node for node in graph.node}
        consumers: dict[str, list[str]] = defaultdict(list)
        for node in graph.node:
            for source in node.input:
                if not source.startswith("^"):
                    consumers[source.split(":")[0]].append(node.name)
        for node in graph.node:
            if node.op not in COLLECTIVES or node.name not in spans:
                continue
            copy = match.group(1) if (match := STEP_COPY.match(node.name)) else ""
            layers = {
                layer
                for tensor in carried_tensors(nodes, node.name)
                if (layer := gradient_layer(nodes, tensor, copy, spans)) is not None
            }
            if not layers:
                continue
            kernels = [name for name in spans if name.startswith(copy) and (m := BACKWARD.search(name)) and int(m.group(1)) in layers]
            entered, done = spans[node.name][0].start, spans[node.name][0].end
            reads = [span.start for reader in consumers[node.name] for span in spans.get(reader, [])]
            found.append(
                Transfer(
                    name=node.name.removeprefix(copy),
                    copy=copy,
                    layers=tuple(sorted(layers)),
                    ready=max(spans[name][0].end for name in kernels),
                    entered=entered,
                    finished=done if done == done else min((start for start in reads if start >= entered), default=float("nan")),
                )
            )
    starts = {copy: forward_starts(spans, next_copy(copy)) for copy in {t.copy for t in found}}
    return [replace(t, needed=starts[t.copy].get(t.layers[0], float("nan"))) for t in found]


def next_copy(copy: str) -> str | None:
    """The name prefix of the step after this one in a graph of several steps (None in a graph of one)."""
    match = re.fullmatch(r"caramel_step_(\d+)/", copy)
    return f"caramel_step_{int(match.group(1)) + 1}/" if match else None


def forward_starts(spans: dict[str, list[Span]], copy: str | None) -> dict[int, float]:
    """When each layer's forward kernel of one step started, by layer."""
    return {kernel.layer: kernel.span.start for kernel in kernels(spans, copy) if kernel.forward}


def carried_tensors(nodes: dict, collective: str) -> list[str]:
    """The producers of the tensors a collective carries: its data inputs, through the ops that
    join several into one."""
    carried, pending = [], [source for source in nodes[collective].input if not source.startswith("^")]
    while pending:
        producer = pending.pop().split(":")[0]
        node = nodes.get(producer)
        if node is not None and node.op in JOINS:
            pending += [source for source in node.input if not source.startswith("^")]
        else:
            carried.append(producer)
    return carried


def gradient_layer(nodes: dict, tensor: str, copy: str, spans: dict[str, list[Span]]) -> int | None:
    """The layer a carried tensor is the gradient of: the lowest whose backward kernel (of the
    same step) it was computed from, by data or, one edge away, by a control dependency (a
    gradient that is its weight's value, read once the kernel ran). None for no gradient."""
    closure = data_ancestors(nodes, tensor) | {tensor}
    sources = closure | {source.lstrip("^").split(":")[0] for name in closure if name in nodes for source in nodes[name].input}
    layers = [int(m.group(1)) for name in sources if name.startswith(copy) and name in spans and (m := BACKWARD.search(name))]
    return min(layers, default=None)


def data_ancestors(nodes: dict, name: str) -> set[str]:
    seen: set[str] = set()
    pending = [name]
    while pending:
        node = nodes.get(pending.pop())
        for source in node.input if node is not None else ():
            producer = source.split(":")[0]
            if not source.startswith("^") and producer not in seen:
                seen.add(producer)
                pending.append(producer)
    return seen


@dataclass(frozen=True)
class StepBudget:
    """Where one step's time went, in seconds (see the module's docstring)."""

    copy: str
    seconds: float
    forward: float
    backward: float
    parameter_wait: float
    boundary: float
    host: float
    link_busy: float
    """Of `seconds`, how long some transfer was in the backend."""


def step_budgets(found: list[Transfer], spans: dict[str, list[Span]]) -> list[StepBudget]:
    """Each traced step's time, kernel by kernel (see the module's docstring)."""
    arrived: dict[tuple[str, int], float] = defaultdict(float)  # (step, layer) -> its parameters' last transfer's end
    for transfer in found:
        for layer in transfer.layers:
            arrived[(transfer.copy, layer)] = max(arrived[(transfer.copy, layer)], transfer.finished)
    previous_copy = {successor: copy for copy in {t.copy for t in found} if (successor := next_copy(copy))}
    budgets = []
    for copy in sorted({t.copy for t in found}, key=lambda name: min(t.entered for t in found if t.copy == name)):
        chain = kernels(spans, copy)
        if not chain:
            continue
        following = kernels(spans, next_copy(copy)) if next_copy(copy) else []
        step_transfers = [t for t in found if t.copy == copy]
        start = chain[0].span.start
        end = following[0].span.start if following else max(chain[-1].span.end, *(t.finished for t in step_transfers))
        waited = host = 0.0
        for before, kernel in zip(chain, chain[1:] + following[:1]):
            gap = max(0.0, kernel.span.start - before.span.end)
            source = copy if kernel in following else previous_copy.get(copy)
            late = arrived.get((source, kernel.layer), 0.0) - before.span.end if kernel.forward and source is not None else 0.0
            waited += min(gap, max(0.0, late))
            host += gap - min(gap, max(0.0, late))
        budgets.append(
            StepBudget(
                copy=copy,
                seconds=end - start,
                forward=sum(k.span.end - k.span.start for k in chain if k.forward),
                backward=sum(k.span.end - k.span.start for k in chain if not k.forward),
                parameter_wait=waited,
                boundary=0.0 if following else end - chain[-1].span.end,
                host=host,
                link_busy=busy_within([Span(t.entered, t.finished) for t in found], start, end),
            )
        )
    return budgets


@dataclass(frozen=True)
class Kernel:
    span: Span
    layer: int
    forward: bool


def kernels(spans: dict[str, list[Span]], copy: str | None) -> list[Kernel]:
    """One step's forward and backward kernels, as they ran."""
    found = []
    for name, node_spans in spans.items():
        if copy is None or not name.startswith(copy) or STEP_COPY.match(name.removeprefix(copy)):
            continue
        if match := FORWARD.search(name) or BACKWARD.search(name):
            found.append(Kernel(node_spans[0], int(match.group(1)), forward=name.endswith("_forward")))
    return sorted(found, key=lambda kernel: kernel.span.start)


def busy_within(intervals: list[Span], start: float, end: float) -> float:
    """How much of [start, end) at least one of the intervals covers."""
    busy, reached = 0.0, start
    for interval in sorted(intervals, key=lambda span: span.start):
        low, high = max(interval.start, reached), min(interval.end, end)
        if high > low:
            busy += high - low
            reached = high
    return busy


def layer_range(layers: tuple[int, ...]) -> str:
    return f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}-{layers[-1]} ({len(layers)})"


def grouped(step: list[Transfer]) -> list[tuple[tuple[int, ...], int, float, float, float, float]]:
    """The step's transfers of the same layers as one row (Horovod's tape sends each tensor of a
    layer in an allreduce of its own): layers, how many, ready, first entered, last finished,
    first needed."""
    rows: dict[tuple[int, ...], list[Transfer]] = defaultdict(list)
    for transfer in step:
        rows[transfer.layers].append(transfer)
    return sorted(
        (
            (layers, len(group), max(t.ready for t in group), min(t.entered for t in group), max(t.finished for t in group), min(t.needed for t in group))
            for layers, group in rows.items()
        ),
        key=lambda row: row[3],
    )


def report(found: list[Transfer], spans: dict[str, list[Span]]) -> str:
    kernel_spans = [span for name, node_spans in spans.items() if BACKWARD.search(name) for span in node_spans]
    origin = min(span.start for span in kernel_spans)
    lines = []
    for copy in sorted({transfer.copy for transfer in found}):
        step_kernels = [span for name, node_spans in spans.items() if name.startswith(copy) and BACKWARD.search(name) for span in node_spans]
        backward = (min(s.start for s in step_kernels) - origin, max(s.end for s in step_kernels) - origin)
        step = [t for t in found if t.copy == copy]
        lines.append(f"\n{copy or 'the step'}: backward pass {backward[0] * 1e3:.1f}-{backward[1] * 1e3:.1f} ms, {len(step)} collectives")
        lines.append(f"{'layers':>14} {'collectives':>11} {'ready':>8} {'entered':>8} {'finished':>9} {'held':>7} {'needed':>8}")
        for layers, count, ready, entered, finished, needed in grouped(step):
            lines.append(
                f"{layer_range(layers):>14} {count:11d} {(ready - origin) * 1e3:8.1f} {(entered - origin) * 1e3:8.1f} "
                f"{(finished - origin) * 1e3:9.1f} {(entered - ready) * 1e3:7.1f} {(needed - origin) * 1e3:8.1f}"
            )
        first_entered = min(t.entered for t in step) - origin
        held = sorted(t.held for t in step)
        lines.append(
            f"first transfer entered at {first_entered * 1e3:.1f} ms, {(backward[1] - first_entered) * 1e3:.1f} ms before the backward "
            f"pass ended; last finished at {(max(t.finished for t in step) - origin) * 1e3:.1f} ms; held: median "
            f"{held[len(held) // 2] * 1e3:.1f} ms, most {held[-1] * 1e3:.1f} ms"
        )
    lines += ["", budget_table(step_budgets(found, spans))]
    return "\n".join(lines)


BUDGET_COLUMNS = ("step", "forward", "backward", "parameter wait", "boundary", "host", "link busy")


def budget_table(budgets: list[StepBudget]) -> str:
    """Where each step's time went, in ms, and the mean step."""
    lines = ["where the time went (ms): " + ", ".join(BUDGET_COLUMNS), f"{'':>16}" + "".join(f"{column:>15}" for column in BUDGET_COLUMNS)]
    for name, rows in [*((b.copy or "the step", [b]) for b in budgets), *([("mean step", budgets)] if len(budgets) > 1 else [])]:
        values = [sum(getattr(b, field) for b in rows) / len(rows) for field in ("seconds", "forward", "backward", "parameter_wait", "boundary", "host", "link_busy")]
        lines.append(f"{name:>16}" + "".join(f"{value * 1e3:15.1f}" for value in values))
    return "\n".join(lines)


def plot(found: list[Transfer], spans: dict[str, list[Span]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backward = [node_spans[0] for name, node_spans in spans.items() if BACKWARD.search(name)]
    forward = [node_spans[0] for name, node_spans in spans.items() if FORWARD.search(name)]
    origin = min(span.start for span in backward)
    figure, axis = plt.subplots(figsize=(12, 0.22 * len(found) + 2.5))
    for row, transfer in enumerate(sorted(found, key=lambda t: (t.copy, t.entered))):
        axis.plot([(transfer.ready - origin) * 1e3], [row], "o", color="tab:green", markersize=3)
        axis.barh(row, (transfer.finished - transfer.entered) * 1e3, left=(transfer.entered - origin) * 1e3, height=0.6, color="tab:blue")
        if not math.isnan(transfer.needed):
            axis.plot([(transfer.needed - origin) * 1e3], [row], "|", color="tab:red", markersize=9)
    for spans_of, color in ((backward, "tab:orange"), (forward, "tab:purple")):
        for span in spans_of:
            axis.axvspan((span.start - origin) * 1e3, (span.end - origin) * 1e3, color=color, alpha=0.08)
    axis.set_xlabel("ms from the first backward kernel\n(shaded: backward kernels orange, forward purple; dot: gradients ready; "
                    "bar: in the backend; tick: the next step's forward kernel needs it)")  # fmt: skip
    axis.set_ylabel("transfers, by entry")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="the directory CARAMEL_BENCH_TRACE named")
    parser.add_argument("--plot", type=Path, help="draw the timeline into this PNG")
    args = parser.parse_args(argv)
    graphs_file = args.trace / GRAPHS_FILE
    if not graphs_file.is_file():
        print(f"step_timeline: no {GRAPHS_FILE} in {args.trace}: the traced run did not reach its traced step", file=sys.stderr)
        return 2
    metadata = config_pb2.RunMetadata()
    metadata.ParseFromString(graphs_file.read_bytes())
    spans = op_spans(args.trace / PROFILE_DIRECTORY)
    found = transfers(list(metadata.partition_graphs), spans)
    if not found:
        print("step_timeline: no collective of the traced execution carries a backward kernel's gradients", file=sys.stderr)
        return 2
    print(report(found, spans))
    if args.plot:
        plot(found, spans, args.plot, str(args.trace))
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
