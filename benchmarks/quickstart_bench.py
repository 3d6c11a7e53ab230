"""The quickstart as a user runs it, Caramel on each backend against plain Horovod: `caramel run examples/quickstart.yaml`.

    python -m benchmarks.quickstart_bench --workers 4 --repeats 5

Each repeat runs three jobs on this machine, as local processes through `caramel run`, one after
another, so that drift of the machine hits all of them alike:
    horovod      the quickstart's model, data and arguments trained by plain Horovod, its tape in
                 a tf.function called once per step, as Horovod's TF2 examples train
                 (benchmarks/quickstart_horovod.py as the job's command; Caramel's horovod
                 package, first on the training processes' path, bypassed)
    caramel@hvd  the quickstart as it is (Caramel's tape, `TrainingRun.fit`, several steps per
                 graph), with spec.caramel.backend horovod: Horovod's collectives, what `auto`
                 picks wherever Horovod is installed
    caramel@tf   the same with spec.caramel.backend tensorflow: TensorFlow's own collectives
(--variants picks some). The examples' own `--horovod-baseline` is gone (the examples train with
Caramel only). A run's figures are the median step time its final report gives (the first step,
which traces the graph, left out) and the whole run's wall time, from `caramel run`'s start to
its end (start-up, graph building and all: what a job this short costs its user); the table gives
the median over the repeats and their spread, and each Caramel variant's over Horovod's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from caramel.contract.api import MemoryAllocator
from caramel.contract.jobfile import parse_job
from caramel.contract.progress import parse_report
from benchmarks.plain_horovod_runner import TENSORFLOWS_OWN_POOLS

REPOSITORY = Path(__file__).resolve().parent.parent
QUICKSTART = REPOSITORY / "examples" / "quickstart.yaml"
BASELINE = "horovod"


def horovod(job: dict) -> dict:
    """The job with plain Horovod's script instead of the example's, the same arguments."""
    spec = {key: value for key, value in job["spec"].items() if key != "script"}
    env = [*spec.get("env", []), *TENSORFLOWS_OWN_POOLS]  # as plain Horovod's users have them
    return {**job, "spec": {**spec, "env": env, "command": [sys.executable, "-m", "benchmarks.quickstart_horovod"]}}


def on_backend(backend: str) -> Callable[[dict], dict]:
    def variant(job: dict) -> dict:
        spec = job["spec"]
        return {**job, "spec": {**spec, "caramel": {**spec.get("caramel", {}), "backend": backend}}}

    return variant


VARIANTS: dict[str, Callable[[dict], dict]] = {BASELINE: horovod, "caramel@tf": on_backend("tensorflow"), "caramel@hvd": on_backend("horovod")}
"""Each variant: the quickstart job as it runs it."""


def run_once(variant: dict, workers: int, directory: Path) -> tuple[float, float]:
    """The median step seconds and the wall seconds of one run of a variant of the job."""
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(variant))
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "caramel.launch.cli", "run", str(path), "--workers", str(workers)],
        cwd=REPOSITORY, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800,
    )  # fmt: skip
    wall_seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    finals = [report for report in map(parse_report, output.splitlines()) if report and report.final]
    if result.returncode != 0 or not finals:
        raise RuntimeError(f"caramel run failed (exit {result.returncode}); its output ends:\n{output[-3000:]}")
    return finals[-1].step_seconds, wall_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="workers (default 4)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant (default 5)")
    parser.add_argument(
        "--memory-allocator", choices=[choice.value for choice in MemoryAllocator],
        help="every variant's spec.workers.memoryAllocator (default: the quickstart's own, tcmalloc)",
    )  # fmt: skip
    parser.add_argument(
        "--variants", default=",".join(VARIANTS),
        help=f"comma-separated, from {', '.join(VARIANTS)}; {BASELINE} always runs (default: all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1:
        parser.error("--workers and --repeats must be at least 1")
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    names = list(dict.fromkeys([BASELINE, *names]))
    job = yaml.safe_load(QUICKSTART.read_text())
    if args.memory_allocator:
        spec = job["spec"]
        spec["workers"] = {**spec.get("workers", {}), "memoryAllocator": args.memory_allocator}
    steps: dict[str, list[float]] = {name: [] for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):
            for name in names:
                step, wall = run_once(VARIANTS[name](job), args.workers, Path(directory))
                steps[name].append(step)
                walls[name].append(wall)
                print(f"run {repeat + 1}/{args.repeats} {name}: median step {step * 1e3:.1f} ms, run {wall:.1f} s", flush=True)
    allocator = parse_job(job, source=str(QUICKSTART)).spec.workers.memory_allocator  # the API's default where unset
    print(
        f"\nquickstart ({QUICKSTART.relative_to(REPOSITORY)}), {args.workers} workers, {args.repeats} runs each, "
        f"memory allocator {allocator.value}"
    )
    print("| variant | median step (ms) | min | max | whole run (s) | min | max |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        step_times, wall_times = steps[name], walls[name]
        print(
            f"| {name} | {statistics.median(step_times) * 1e3:.1f} | {min(step_times) * 1e3:.1f} | {max(step_times) * 1e3:.1f} "
            f"| {statistics.median(wall_times):.1f} | {min(wall_times):.1f} | {max(wall_times):.1f} |"
        )
    print()
    for name in names[1:]:
        print(summary_line(name, steps, walls))
    return 0


def summary_line(name: str, steps: dict[str, list[float]], walls: dict[str, list[float]]) -> str:
    """A Caramel variant's median step and whole run over plain Horovod's."""
    ratio = statistics.median(steps[name]) / statistics.median(steps[BASELINE])
    wall_ratio = statistics.median(walls[name]) / statistics.median(walls[BASELINE])
    return f"quickstart {name}_over_horovod={ratio:.3f} whole_run_{name}_over_horovod={wall_ratio:.3f}"


if __name__ == "__main__":
    sys.exit(main())
