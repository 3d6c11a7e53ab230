"""Horovod-shaped scripts, unchanged, under Caramel against plain Horovod on the same scripts.

    python -m benchmarks.horovod_scripts_bench                                   # the four scripts, 2 workers, 3 repeats
    python -m benchmarks.horovod_scripts_bench --scripts mnist,keras_mnist --repeats 5
    python -m benchmarks.horovod_scripts_bench --smoke --repeats 1               # tiny arguments: does it all work?
    python -m benchmarks.horovod_scripts_bench --report runs/horovod-scripts-<time>/results.json

Issue 26, item 4, and issue 35, item 2: each of the four scripts in examples/horovod/ (in the shape
of Horovod's TF2 examples) runs under Caramel on tf-keras at most 1.0x plain Horovod on the same
script. Per script, the same arguments, six variants, each a `caramel run` of a generated
CaramelJob on this machine (local processes; `--workers` workers of one slot, the job's memory
allocator), so all start the same way (the worker entrypoint, the rendezvous, the environment
contract):
    horovod             plain Horovod 0.28.1 in the Keras 2 world it was written for:
                        `spec.command: [python, -m, benchmarks.plain_horovod_runner, SCRIPT]`
                        (Caramel's horovod package off the path, tf-keras for tf.keras and
                        `keras`; plain_horovod_runner.py)
    caramel-horovod     the script as it is (`spec.script`), Caramel serving Horovod's API on
                        Horovod's collectives (`spec.caramel.backend: horovod`, what `auto` picks
                        for a script that imports Horovod), on Keras 3 (TensorFlow's tf.keras)
    caramel-tensorflow  the same on TensorFlow's collectives (`backend: tensorflow`), on Keras 3
    caramel-horovod-keras2, caramel-tensorflow-keras2
                        the same two on tf-keras, as Horovod's users run their scripts: the job's
                        environment sets TF_USE_LEGACY_KERAS=1 (docs/training-scripts.md)
    horovod-sized-pools a control, not Caramel: plain Horovod as above, with TensorFlow's thread
                        pools sized as Caramel's workers size them (TF_NUM_INTRAOP_THREADS and
                        TF_NUM_INTEROP_THREADS by `caramel.contract.cpus.pool_sizes` for the
                        workers on this machine), so that what the pools give and what the rest of
                        Caramel gives show apart
Keras 3's own cost shows as the keras2 variants against the others; plain Horovod against
caramel-*-keras2 is Caramel's, on the same Keras.
Every variant's job has the same environment besides: PYTHONUNBUFFERED=1 (so that each printed line
arrives when the script prints it) and the repository on PYTHONPATH (the runner's package); each
run's working directory is its own scratch directory under the output directory (the MNIST
scripts write checkpoints into it). Repeats are interleaved, every script's variants in a
rotating order (repeat r starts with variant r mod 3), so that drift of the machine hits all alike.

Per run: the whole run's wall time (`caramel run` from start to end: start-up, tracing, everything
a user waits for), the steady step time from the script's own output (below), and each rank's
peak RSS (VmHWM of every training process, polled every half second through /proc by psutil).
The steady step is the time of the steps after the first quarter of the run's steps (tracing,
Caramel's first plans: WARMUP_FRACTION) over their number, from rank 0's output:
    synthetic_benchmark, keras_synthetic_benchmark  each iteration's `Iter #i: X img/sec per CPU`
                        (the script's own timing: batch size x steps per iteration / X seconds)
    mnist               the arrival of its `Step #N` lines (every 10 steps; `caramel run`'s output
                        read line by line as it comes, each line stamped on arrival)
    keras_mnist         the arrival of Keras's `Epoch k/N` lines (each epoch's start; the last
                        epoch has no such line at its end and is not timed, so it needs 3 epochs)
The tables give per script and variant the median and min-max over the repeats, and each other
variant over plain Horovod: the ratio of the medians and, in brackets, the min-max of the
per-repeat ratios (each run against the Horovod run of its own repeat). The summary lines give each
script's ratios; `results.json` (rewritten after every run), every run's job file and output, and
`ratios.png` (a bar group per script, a bar per variant but plain Horovod: its step and its whole
run over plain Horovod's, a line at 1.0) go to the output directory (runs/horovod-scripts-<time>/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import yaml

from caramel.contract.api import MemoryAllocator
from caramel.contract.cpus import INTER_OP_VARIABLE, INTRA_OP_VARIABLE, machine_cpus, pool_sizes
from benchmarks.plain_horovod_runner import TENSORFLOWS_OWN_POOLS
from benchmarks.plots import draw
from testbed.ports import free_port_block

REPOSITORY = Path(__file__).resolve().parent.parent
EXAMPLES = REPOSITORY / "examples" / "horovod"
BASELINE = "horovod"
SIZED_POOLS = "horovod-sized-pools"
"""The control: plain Horovod with Caramel's thread pools."""
VARIANTS = (BASELINE, SIZED_POOLS, "caramel-horovod", "caramel-tensorflow", "caramel-horovod-keras2", "caramel-tensorflow-keras2")
BACKENDS = {
    "caramel-horovod": "horovod", "caramel-tensorflow": "tensorflow", "caramel-horovod-keras2": "horovod", "caramel-tensorflow-keras2": "tensorflow",
}  # fmt: skip
KERAS_2 = {"TF_USE_LEGACY_KERAS": "1"}
"""The environment of a job that runs on tf-keras (the keras2 variants)."""
WARMUP_FRACTION = 0.25
"""The first quarter of a run's steps are not timed (tracing; Caramel's first plans)."""
RSS_POLL_SECONDS = 0.5
OTHERS_EVERY_POLLS = 6
"""Every 3 s, the poller also looks for other benchmarks or training processes on the machine."""
OTHER_PROCESS = re.compile(r"-m (benchmarks\.|caramel\.launch\.|pytest)|caramel(-worker)? run")
RUN_TIMEOUT_SECONDS = 1800
ITER_LINE = re.compile(r"rank 0 \| Iter #(\d+): ([\d.]+) img/sec per")
STEP_LINE = re.compile(r"rank 0 \| Step #(\d+)\s")
EPOCH_LINE = re.compile(r"rank 0 \| Epoch (\d+)/(\d+)\s*$")


@dataclass(frozen=True)
class Script:
    """One of the four scripts: its arguments (full and smoke) and how its output is timed."""

    name: str
    args: tuple[str, ...]
    smoke_args: tuple[str, ...]
    timing: str  # "iterations", "steps" or "epochs"

    @property
    def path(self) -> Path:
        return EXAMPLES / f"{self.name}.py"


# Sized so that each run stays short on a 2-core machine with 2 workers, start-up included
# (TensorFlow's import, building and tracing the model: most of a synthetic benchmark's run), while
# enough of it is timed to give a steady step: a small keras.applications model at a small image size, MNIST-sized convolutions at batch 32. The synthetic
# benchmarks get --no-cuda (this machine has no GPU): without it keras_synthetic_benchmark.py calls
# hvd.sycl_built(), which Horovod 0.28.1 lacks (Horovod's example gained it after that release).
SCRIPTS = {
    script.name: script
    for script in (
        Script(
            "synthetic_benchmark",
            ("--no-cuda", "--model", "MobileNetV2", "--image-size", "64", "--batch-size", "16", "--num-warmup-batches", "5",
             "--num-batches-per-iter", "5", "--num-iters", "10"),
            ("--no-cuda", "--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "3"),
            "iterations",
        ),
        Script(
            "keras_synthetic_benchmark",
            ("--no-cuda", "--model", "MobileNetV2", "--image-size", "64", "--batch-size", "16", "--num-batches-per-iter", "5",
             "--num-iters", "10"),
            ("--no-cuda", "--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4", "--num-batches-per-iter", "2",
             "--num-iters", "3"),
            "iterations",
        ),
        Script("mnist", ("--steps", "600", "--batch-size", "32"), ("--steps", "80", "--batch-size", "16"), "steps"),
        Script(
            "keras_mnist",
            ("--epochs", "5", "--steps-per-epoch", "160", "--batch-size", "32"),
            ("--epochs", "3", "--steps-per-epoch", "8", "--batch-size", "16"),
            "epochs",
        ),
    )
}  # fmt: skip


@dataclass
class Run:
    script: str
    variant: str
    repeat: int
    wall_seconds: float | None = None
    step_seconds: float | None = None
    """The steady step: seconds per step of rank 0 over the timed steps; None where the output gave none."""
    timed_steps: int = 0
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    """Each rank's peak RSS (VmHWM), by rank."""
    load_average: float | None = None
    """The 1-minute load average when the run started."""
    others: list[str] = field(default_factory=list)
    """Other benchmark or training processes seen running beside the run (their commands, cut short)."""
    log: str = ""
    error: str | None = None


# -- the script's own output --------------------------------------------------------------------


def argument(args: Sequence[str], name: str, default: int) -> int:
    """The value of an integer flag in a script's arguments."""
    args = list(args)
    return int(args[args.index(name) + 1]) if name in args else default


def progress_points(script: Script, args: Sequence[str], size: int, lines: Sequence[tuple[float, str]]) -> list[tuple[float, int]]:
    """(seconds, steps done by rank 0) along the run, read from its output lines stamped with their
    arrival (seconds)."""
    points: list[tuple[float, int]] = []
    if script.timing == "iterations":
        # The script's own clock: each iteration's images per second, so its duration.
        batch = argument(args, "--batch-size", 32)
        per_iteration = argument(args, "--num-batches-per-iter", 10)
        elapsed, steps = 0.0, 0
        points.append((elapsed, steps))
        for _, line in lines:
            match = ITER_LINE.search(line)
            if match and float(match.group(2)) > 0:
                elapsed += batch * per_iteration / float(match.group(2))
                steps += per_iteration
                points.append((elapsed, steps))
    elif script.timing == "steps":
        # `Step #N` after step N (0-based) ran: N + 1 steps done.
        for stamp, line in lines:
            match = STEP_LINE.search(line)
            if match:
                points.append((stamp, int(match.group(1)) + 1))
    elif script.timing == "epochs":
        # `Epoch k/N` as epoch k begins: k - 1 epochs done, of steps_per_epoch // size steps each.
        per_epoch = argument(args, "--steps-per-epoch", 500) // size
        for stamp, line in lines:
            match = EPOCH_LINE.search(line)
            if match:
                points.append((stamp, (int(match.group(1)) - 1) * per_epoch))
    else:
        raise ValueError(f"unknown timing {script.timing!r}")
    return points


def steady_step(points: Sequence[tuple[float, int]], warmup_fraction: float = WARMUP_FRACTION) -> tuple[float | None, int]:
    """Seconds per step from the first point at or past `warmup_fraction` of the last point's steps
    to the last point, and the number of steps timed; (None, 0) where fewer than two points remain."""
    if len(points) < 2:
        return None, 0
    total = points[-1][1]
    start = next((point for point in points[:-1] if point[1] >= warmup_fraction * total), points[-2])
    steps = points[-1][1] - start[1]
    if steps <= 0:
        return None, 0
    return (points[-1][0] - start[0]) / steps, steps


# -- one run ------------------------------------------------------------------------------------


def job_document(script: Script, variant: str, args: Sequence[str], workers: int, working_dir: Path,
                 memory_allocator: str | None, python: str = sys.executable) -> dict:  # fmt: skip
    """The CaramelJob of one run: the same for every variant but for how the script is started, the
    backend and the Keras."""
    spec: dict = {
        "args": list(args),
        "workingDir": str(working_dir),
        "workers": {"replicas": workers},
        "rendezvous": {"port": free_port_block(1 + workers)},  # and the collective ports after it
        "metrics": {"port": free_port_block(workers)},
        "runPolicy": {"backoffLimit": 0},  # a restart would hide in the wall time
        "env": [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "PYTHONPATH", "value": str(REPOSITORY)},
        ],
    }
    if memory_allocator:
        spec["workers"]["memoryAllocator"] = memory_allocator
    if variant in (BASELINE, SIZED_POOLS):
        spec["command"] = [python, "-m", "benchmarks.plain_horovod_runner", str(script.path)]
        if variant == SIZED_POOLS:  # every worker runs on this machine, one rank each
            pools = pool_sizes(machine_cpus(), workers)
            spec["env"] += [{"name": INTRA_OP_VARIABLE, "value": str(pools.intra_op)}, {"name": INTER_OP_VARIABLE, "value": str(pools.inter_op)}]
        else:
            spec["env"] += TENSORFLOWS_OWN_POOLS
    else:
        spec["script"] = str(script.path)
        spec["caramel"] = {"backend": BACKENDS[variant]}
        if variant.endswith("-keras2"):
            spec["env"] += [{"name": name, "value": value} for name, value in KERAS_2.items()]
    name = f"hvd-{script.name.replace('_', '-')}-{variant}"
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name}, "spec": spec}


class PeakMemory(threading.Thread):
    """The peak RSS (VmHWM) of every training process under a `caramel run`, by rank, polled until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stopped = threading.Event()
        self.peaks: dict[int, float] = {}
        self.others: dict[int, str] = {}
        self._ranks: dict[int, int | None] = {}

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            me = psutil.Process()
            self._bench = {me.pid, *(parent.pid for parent in me.parents())}  # this driver and what started it
        except psutil.Error:
            return
        polls = 0
        while not self.stopped.wait(RSS_POLL_SECONDS):
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                return
            if polls % OTHERS_EVERY_POLLS == 0:
                self._look_for_others(psutil, {root.pid, *self._bench, *(child.pid for child in children)})
            polls += 1
            for process in children:
                try:
                    # Only a rank found is kept: between fork and exec a training process still
                    # reads as its parent.
                    rank = self._ranks.get(process.pid)
                    if rank is None:
                        rank = self._ranks[process.pid] = training_rank(process)
                    if rank is not None:
                        self.peaks[rank] = max(self.peaks.get(rank, 0.0), vm_hwm_mib(process.pid))
                except (psutil.Error, OSError, ValueError):
                    continue

    def _look_for_others(self, psutil, ours: set[int]) -> None:  # noqa: ANN001 (the module)
        for process in psutil.process_iter(["pid", "cmdline"]):
            command = " ".join(process.info["cmdline"] or ())
            if process.info["pid"] in ours or not OTHER_PROCESS.search(command):
                continue
            try:  # one of the run's own, started since its children were listed
                if any(parent.pid == self.pid for parent in process.parents()):
                    continue
            except psutil.Error:
                continue
            self.others.setdefault(process.info["pid"], command[:160])

    def stop(self) -> dict[str, float]:
        self.stopped.set()
        self.join(timeout=5)
        return {str(rank): round(peak, 1) for rank, peak in sorted(self.peaks.items())}


def training_rank(process) -> int | None:  # noqa: ANN001 (a psutil.Process)
    """The rank of a training process (a child of the worker entrypoint, with HOROVOD_RANK), else None."""
    parent = process.parent()
    if parent is None or "caramel.launch.entrypoint" not in " ".join(parent.cmdline()):
        return None
    rank = process.environ().get("HOROVOD_RANK")
    return int(rank) if rank is not None else None


def vm_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_once(script: Script, variant: str, args: Sequence[str], workers: int, directory: Path, repeat: int,
             memory_allocator: str | None) -> Run:  # fmt: skip
    """One `caramel run` of the script's job for the variant, in a directory of its own."""
    directory.mkdir(parents=True, exist_ok=True)
    scratch = directory / "work"
    scratch.mkdir(exist_ok=True)
    job_file = directory / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_document(script, variant, args, workers, scratch, memory_allocator), sort_keys=False))
    run = Run(script.name, variant, repeat, load_average=round(os.getloadavg()[0], 2), log=str(directory / "output.log"))
    lines: list[tuple[float, str]] = []
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "caramel.launch.cli", "run", str(job_file)],
        cwd=REPOSITORY, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    memory = PeakMemory(process.pid)
    memory.start()
    timer = threading.Timer(RUN_TIMEOUT_SECONDS, lambda: process.send_signal(signal.SIGINT))
    timer.start()
    try:
        for raw in iter(cast(IO[bytes], process.stdout).readline, b""):  # stdout=PIPE
            lines.append((time.perf_counter() - started, raw.decode("utf-8", errors="replace").rstrip("\n")))
        returncode = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
    wall = time.perf_counter() - started
    run.peak_rss_mib = memory.stop()
    run.others = sorted(set(memory.others.values()))
    with open(run.log, "w") as log:
        log.writelines(f"{stamp:9.3f} {line}\n" for stamp, line in lines)
    if returncode != 0:
        tail = "\n".join(line for _, line in lines[-15:])
        run.error = f"caramel run exited {returncode}; its output ends:\n{tail}"
        return run
    run.wall_seconds = round(wall, 3)
    step, steps = steady_step(progress_points(script, args, workers, lines))
    run.step_seconds, run.timed_steps = (round(step, 6) if step is not None else None), steps
    return run


# -- the tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass(frozen=True)
class Ratio:
    """A variant over plain Horovod: the ratio of the medians, and the min-max of the
    per-repeat ratios (each run over the Horovod run of its own repeat)."""

    of_medians: float
    low: float
    high: float
    pairs: int


def ratio(runs: Sequence[Run], variant: str, metric: str) -> Ratio | None:
    """`variant`'s `metric` ("step_seconds" or "wall_seconds") over plain Horovod's."""
    mine = {run.repeat: getattr(run, metric) for run in runs if run.variant == variant and getattr(run, metric) is not None}
    theirs = {run.repeat: getattr(run, metric) for run in runs if run.variant == BASELINE and getattr(run, metric) is not None}
    if not mine or not theirs:
        return None
    paired = [mine[repeat] / theirs[repeat] for repeat in sorted(mine.keys() & theirs.keys())]
    of_medians = statistics.median(mine.values()) / statistics.median(theirs.values())
    return Ratio(of_medians, min(paired, default=math.nan), max(paired, default=math.nan), len(paired))


def largest_rank_mib(run: Run) -> float | None:
    return max(run.peak_rss_mib.values()) if run.peak_rss_mib else None


def summarize(runs: Sequence[Run], script: str) -> dict[str, dict]:
    """Per variant of one script: the spreads of step, wall and peak RSS (largest rank), and the ratios to Horovod."""
    rows: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        mine = [run for run in runs if run.script == script and run.variant == variant]
        if not mine:
            continue
        ok = [run for run in mine if run.error is None]
        rows[variant] = {
            "runs": len(mine),
            "failed": len(mine) - len(ok),
            "step": Spread.of([run.step_seconds for run in ok if run.step_seconds is not None]),
            "wall": Spread.of([run.wall_seconds for run in ok if run.wall_seconds is not None]),
            "rss": Spread.of([mib for mib in map(largest_rank_mib, ok) if mib is not None]),
        }
        if variant != BASELINE:
            script_runs = [run for run in runs if run.script == script]
            rows[variant]["step_ratio"] = ratio(script_runs, variant, "step_seconds")
            rows[variant]["wall_ratio"] = ratio(script_runs, variant, "wall_seconds")
            rows[variant]["rss_ratio"] = rss_ratio(script_runs, variant)
    return rows


def rss_ratio(runs: Sequence[Run], variant: str) -> float | None:
    mine = [mib for run in runs if run.variant == variant and run.error is None and (mib := largest_rank_mib(run)) is not None]
    theirs = [mib for run in runs if run.variant == BASELINE and run.error is None and (mib := largest_rank_mib(run)) is not None]
    return statistics.median(mine) / statistics.median(theirs) if mine and theirs else None


def spread_text(spread: Spread | None, scale: float = 1.0, digits: int = 1) -> str:
    if spread is None:
        return "-"
    return f"{spread.median * scale:.{digits}f} ({spread.low * scale:.{digits}f}-{spread.high * scale:.{digits}f})"


def ratio_text(value: Ratio | None) -> str:
    if value is None:
        return "-"
    if value.pairs == 0:
        return f"{value.of_medians:.3f}x"
    return f"{value.of_medians:.3f}x [{value.low:.3f}-{value.high:.3f}]"


def table(runs: Sequence[Run], script: Script, args: Sequence[str]) -> list[str]:
    rows = summarize(runs, script.name)
    timing = {"iterations": "its Iter lines", "steps": "its Step lines' arrival", "epochs": "its Epoch lines' arrival"}[script.timing]
    lines = [
        f"{script.name} ({shlex.join(args)}): steady step from {timing}, after the first {WARMUP_FRACTION:.0%} of its steps",
        "| variant | runs | steady step (ms) | step / horovod | whole run (s) | run / horovod | peak RSS, largest rank (MiB) | RSS / horovod |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for variant, row in rows.items():
        failed = f" ({row['failed']} failed)" if row["failed"] else ""
        rss = row.get("rss_ratio")
        lines.append(
            f"| {variant} | {row['runs']}{failed} | {spread_text(row['step'], 1e3)} | {ratio_text(row.get('step_ratio')) if variant != BASELINE else ''} "
            f"| {spread_text(row['wall'])} | {ratio_text(row.get('wall_ratio')) if variant != BASELINE else ''} "
            f"| {spread_text(row['rss'], digits=0)} | {f'{rss:.2f}x' if rss is not None else ''} |"
        )
    return lines


def summary_line(runs: Sequence[Run], script: str) -> str:
    rows = summarize(runs, script)
    parts = [script]
    for variant in VARIANTS[1:]:
        if variant not in rows:
            continue
        key = variant.replace("-", "_")
        for metric, name in (("step_ratio", "step"), ("wall_ratio", "run")):
            value = rows[variant].get(metric)
            parts.append(f"{key}_{name}_over_horovod={value.of_medians:.3f}" if value else f"{key}_{name}_over_horovod=-")
    return " ".join(parts)


def report_lines(document: dict) -> list[str]:
    runs = [Run(**run) for run in document["runs"]]
    lines = []
    for name, args in document["scripts"].items():
        lines += ["", *table(runs, SCRIPTS[name], args)]
        failures = [run for run in runs if run.script == name and run.error]
        lines += [f"  {run.variant} run {run.repeat + 1} failed: {cast(str, run.error).splitlines()[0]} (log {run.log})" for run in failures]
        crowded = [run for run in runs if run.script == name and run.others]
        lines += [f"  {run.variant} run {run.repeat + 1}: other benchmark or training processes ran beside it ({run.others[0]})" for run in crowded]
    lines.append("")
    lines += [summary_line(runs, name) for name in document["scripts"]]
    return lines


def plot(document: dict, path: Path) -> None:
    """A bar group per script, a bar per variant but plain Horovod: its steady step (left) and whole run
    (right) over plain Horovod's, the per-repeat ratios' min-max as error bars, a line at 1.0."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    runs = [Run(**run) for run in document["runs"]]
    names = list(document["scripts"])
    compared = VARIANTS[1:]
    figure, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(names) * 2), 4.8), squeeze=False)
    width = 0.8 / len(compared)
    for axis, (metric, title) in zip(axes[0], (("step_seconds", "steady step"), ("wall_seconds", "whole run (caramel run, start to end)"))):
        for index, variant in enumerate(compared):
            values = [ratio([run for run in runs if run.script == name], variant, metric) for name in names]
            heights = [value.of_medians if value else math.nan for value in values]
            errors = [
                [max(0.0, value.of_medians - value.low) if value and value.pairs else 0.0 for value in values],
                [max(0.0, value.high - value.of_medians) if value and value.pairs else 0.0 for value in values],
            ]
            positions = [i + (index - (len(compared) - 1) / 2) * width for i in range(len(names))]
            axis.bar(positions, heights, width, yerr=errors, capsize=3, label=variant)
            for position, height in zip(positions, heights):
                if not math.isnan(height):
                    axis.annotate(f"{height:.2f}", (position, height), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        axis.axhline(1.0, color="black", linewidth=1)
        axis.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
        axis.set(ylabel="over plain Horovod", title=title)
        axis.legend(fontsize=8)
        axis.grid(True, axis="y", alpha=0.3)
    smoke = ", --smoke: tiny arguments, measuring nothing" if document.get("smoke") else ""
    figure.suptitle(
        f"Horovod-shaped scripts, {document['workers']} workers, {document['repeats']} repeat(s), commit {document['commit']}{smoke}", fontsize=10
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# -- the driver ---------------------------------------------------------------------------------


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPOSITORY, capture_output=True, text=True, check=False)
    return (result.stdout.strip() or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def parse_scripts(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCRIPTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(SCRIPTS)})")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", type=parse_scripts, default=list(SCRIPTS), metavar="A,B", help=f"default: all ({', '.join(SCRIPTS)})")
    parser.add_argument("--variants", type=parse_variants, default=list(VARIANTS), metavar="A,B",
                        help=f"default: all ({', '.join(VARIANTS)}); {BASELINE} is always run")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="workers of one slot each (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant of each script (default 3)")
    parser.add_argument("--smoke", action="store_true", help="each script's tiny arguments: checks that everything runs, measures nothing")
    parser.add_argument("--memory-allocator", choices=[choice.value for choice in MemoryAllocator],
                        help="every job's spec.workers.memoryAllocator (default: the API's, tcmalloc)")  # fmt: skip
    parser.add_argument("--output", type=Path, help="output directory (default runs/horovod-scripts-<time>/)")
    parser.add_argument("--report", type=Path, metavar="RESULTS_JSON", help="print an earlier run's tables and draw its plot again; runs nothing")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1:
        parser.error("--workers and --repeats must be at least 1")
    return args


def parse_variants(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(VARIANTS)})")
    return [variant for variant in VARIANTS if variant in names or variant == BASELINE]


def rotated(variants: Sequence[str], repeat: int) -> list[str]:
    """The order of the variants in a repeat: repeat r starts with variant r mod len(variants)."""
    shift = repeat % len(variants)
    return [*variants[shift:], *variants[:shift]]


def main(argv: list[str] | None = None, say: Callable[[str], None] = lambda text: print(text, flush=True)) -> int:
    args = parse_args(argv)
    if args.report:
        document = json.loads(args.report.read_text())
        for line in report_lines(document):
            say(line)
        plot(document, args.report.with_name("ratios.png"))
        say(f"plot: {args.report.with_name('ratios.png')}")
        return 0
    output = (args.output or REPOSITORY / "runs" / time.strftime("horovod-scripts-%Y%m%d-%H%M%S")).resolve()
    output.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "benchmarks.horovod_scripts_bench", *(sys.argv[1:] if argv is None else argv)])
    document = {
        "command": command,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "workers": args.workers,
        "repeats": args.repeats,
        "smoke": args.smoke,
        "warmup_fraction": WARMUP_FRACTION,
        "scripts": {name: list(SCRIPTS[name].smoke_args if args.smoke else SCRIPTS[name].args) for name in args.scripts},
        "runs": [],
    }
    say(f"# {command}  ({document['date']}, commit {document['commit']}, {document['cores']} cores, {args.workers} workers)")
    if args.smoke:
        say("# --smoke: tiny arguments; these numbers measure nothing")
    load = os.getloadavg()[0]
    if load > 0.5:
        say(f"warning: load average {load:.1f}: other processes compete for the CPU the workers need")
    say(f"output in {output}")
    results = output / "results.json"
    runs: list[Run] = []
    try:
        for repeat in range(args.repeats):
            for name in args.scripts:
                script, script_args = SCRIPTS[name], document["scripts"][name]
                for variant in rotated(args.variants, repeat):
                    run = run_once(script, variant, script_args, args.workers, output / f"{name}-{variant}-{repeat + 1}", repeat, args.memory_allocator)
                    runs.append(run)
                    document["runs"] = [asdict(run) for run in runs]
                    results.write_text(json.dumps(document, indent=1))
                    if run.error:
                        say(f"run {repeat + 1}/{args.repeats} {name} {variant}: FAILED, {run.error.splitlines()[0]} (log {run.log})")
                        continue
                    step = f"{run.step_seconds * 1e3:.1f} ms over {run.timed_steps} steps" if run.step_seconds else "no steady timing"
                    rss = f", peak RSS {largest_rank_mib(run):.0f} MiB" if run.peak_rss_mib else ""
                    say(f"run {repeat + 1}/{args.repeats} {name} {variant}: step {step}, run {run.wall_seconds:.1f} s{rss} (load {run.load_average:.1f})")
                    if run.others:
                        say(f"  warning: {len(run.others)} other benchmark or training process(es) ran beside it, e.g. {run.others[0]}")
    except KeyboardInterrupt:
        say("interrupted: the tables of the runs that finished")
    for line in report_lines(document):
        say(line)
    say(f"results: {results}; {draw(lambda path: plot(document, path), output / 'ratios.png')}")
    return 1 if any(run.error for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
