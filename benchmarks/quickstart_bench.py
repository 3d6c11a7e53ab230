"""The quickstart as a user runs it, Caramel against Horovod: `caramel run examples/quickstart.yaml`.

    python -m benchmarks.quickstart_bench --workers 4 --repeats 5

Each repeat runs the quickstart job twice on this machine, as local processes: as it is
(Caramel's tape, `TrainingRun.fit`, several steps per graph) and with `--horovod-baseline` added
to its args (Horovod's tape in a `tf.function` called once per step, as Horovod documents it).
The two alternate, so that drift of the machine hits both alike. A run's figures are the median
step time `caramel run` reports at the end (the first execution, which traces the graph, left
out) and the whole run's wall time, from `caramel run`'s start to its end (start-up, graph
building and all: what a job this short costs its user); the table gives the median over the
repeats and their spread, and Caramel's over Horovod's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from caramel.job.api import MemoryAllocator
from caramel.job.jobfile import parse_job
from caramel.job.progress import parse_report

REPOSITORY = Path(__file__).resolve().parent.parent
QUICKSTART = REPOSITORY / "examples" / "quickstart.yaml"
VARIANTS = {"caramel": [], "horovod": ["--horovod-baseline"]}


def run_once(job: dict, extra_args: list[str], workers: int, directory: Path) -> tuple[float, float]:
    """The median step seconds and the wall seconds of one run of the job with extra_args
    appended to its args."""
    variant = {**job, "spec": {**job["spec"], "args": [*job["spec"].get("args", []), *extra_args]}}
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
        help="both variants' spec.workers.memoryAllocator (default: the quickstart's own, tcmalloc)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1:
        parser.error("--workers and --repeats must be at least 1")
    job = yaml.safe_load(QUICKSTART.read_text())
    if args.memory_allocator:
        spec = job["spec"]
        spec["workers"] = {**spec.get("workers", {}), "memoryAllocator": args.memory_allocator}
    steps: dict[str, list[float]] = {name: [] for name in VARIANTS}
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):
            for name, extra in VARIANTS.items():
                step, wall = run_once(job, extra, args.workers, Path(directory))
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
    for name in VARIANTS:
        step, wall = steps[name], walls[name]
        print(
            f"| {name} | {statistics.median(step) * 1e3:.1f} | {min(step) * 1e3:.1f} | {max(step) * 1e3:.1f} "
            f"| {statistics.median(wall):.1f} | {min(wall):.1f} | {max(wall):.1f} |"
        )
    ratio = statistics.median(steps["caramel"]) / statistics.median(steps["horovod"])
    wall_ratio = statistics.median(walls["caramel"]) / statistics.median(walls["horovod"])
    print(f"\nquickstart caramel_over_horovod={ratio:.3f} whole_run_caramel_over_horovod={wall_ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
