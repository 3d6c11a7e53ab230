"""What a lost worker costs an elastic gang, on each backend, against a gang that restarts whole
(not a timed test).

    python -m benchmarks.elastic_reform_bench [--repeat 3] [--kill-at 100] [--out benchmarks/results/NAME]

Each trial runs `examples/horovod/mnist_elastic.py` (Horovod's elastic TF2 example in shape,
unchanged: 200 steps, a commit every 5) under `caramel run`, 3 workers, and kills the training
process of rank 2 once rank 0 has logged step 100 (--kill-at) or more; `caramel run` starts that
worker again. Three
ways a gang can take the loss:
- `horovod, elastic` (minReplicas 2): the survivors re-form in their processes;
- `tensorflow, elastic` (minReplicas 2): the survivors' training processes restart to re-form,
  each keeping its last commit in memory across the restart;
- `tensorflow, whole gang` (minReplicas unset): every worker restarts, and the script, which writes
  no checkpoint, starts over.
For each: the seconds from the kill to rank 0's first step after it, the steps run again (the last
step logged before the kill, minus the step the gang went on from), the seconds until the gang was
back past the last step logged before the kill, and the whole run. Prints a
line per trial and a table of medians with their spread, and writes the table (.txt) and a plot
(.png) where --out names a path. Run with the project's virtualenv; one benchmark at a time.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.plots import draw
from testbed.local_runs import REPO, BackgroundRun, digests
from testbed.ports import free_port_block

SCRIPT = REPO / "examples" / "horovod" / "mnist_elastic.py"
STEPS = 200
COMMIT_EVERY = 5
KILLED_RANK = 2
WORKERS = 3
STEP = re.compile(r"rank 0 \| Step #(\d+)\s+Loss: \S+\s+ranks (\d+)\s+([\d.]+)")


@dataclass(frozen=True)
class Way:
    backend: str
    elastic: bool

    @property
    def label(self) -> str:
        return f"{self.backend}, {'elastic' if self.elastic else 'whole gang'}"


WAYS = (Way("horovod", True), Way("tensorflow", True), Way("tensorflow", False))


@dataclass(frozen=True)
class Trial:
    resumed_seconds: float
    """From the kill to rank 0's first step after it."""
    steps_again: int
    caught_up_seconds: float
    """From the kill to rank 0's first step past the last one logged before the kill."""
    ranks_after: int
    total_seconds: float


def job(way: Way) -> dict:
    rendezvous = free_port_block(1 + 2 * WORKERS)
    workers: dict = {"replicas": WORKERS, **({"minReplicas": WORKERS - 1} if way.elastic else {})}
    return {
        "apiVersion": "caramel.dev/v1alpha1",
        "kind": "CaramelJob",
        "metadata": {"name": "elastic-bench"},
        "spec": {
            "script": str(SCRIPT),
            "args": ["--steps", str(STEPS), "--batch-size", "16", "--commit-every", str(COMMIT_EVERY), "--log-every", "1"],
            "env": [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}],
            "workers": workers,
            "rendezvous": {"port": rendezvous},
            "metrics": {"port": free_port_block(WORKERS)},
            "caramel": {"backend": way.backend, "transportPort": free_port_block(WORKERS)},
            "runPolicy": {"backoffLimit": 2},
        },
    }


def logged_steps(output: str) -> list[tuple[int, int, float]]:
    """Rank 0's steps, in the order logged: (step, ranks, time)."""
    return [(int(step), int(ranks), float(at)) for step, ranks, at in STEP.findall(output)]


def trial(way: Way, directory: Path, kill_at: int) -> Trial:
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job(way), sort_keys=False))
    started = time.time()
    run = BackgroundRun(path)
    deadline = time.monotonic() + 600
    while not any(step >= kill_at for step, _, _ in logged_steps(run.output)):
        if run.process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{way.label}: no step {kill_at} logged; the output so far:\n{run.output[-4000:]}")
        time.sleep(0.05)
    run.training_process(KILLED_RANK).send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = run.finish(timeout=900)
    output = run.output
    (directory / "output.txt").write_text(output)
    final = digests(output)
    if code != 0 or len(final) != WORKERS or len(set(final.values())) != 1:
        raise SystemExit(f"{way.label}: the run failed (exit {code}, digests {final}); its output: {directory / 'output.txt'}")
    steps = logged_steps(output)
    before = max(step for step, _, at in steps if at < killed_at)
    first_step, ranks_after, first_at = next(entry for entry in steps if entry[2] >= killed_at)
    caught_up_at = next(at for step, _, at in steps if at >= killed_at and step > before)
    return Trial(first_at - killed_at, before - (first_step - 1), caught_up_at - killed_at, ranks_after, time.time() - started)


def spread(values: list[float], unit: str = " s") -> str:
    return f"{statistics.median(values):.1f}{unit} ({min(values):.1f}-{max(values):.1f})"


def table(results: dict[Way, list[Trial]]) -> str:
    lines = [
        f"{'way':<24} {'kill to first step after':>26} {'steps run again':>18} {'kill to caught up':>20} {'whole run':>20}",
    ]
    for way, trials in results.items():
        lines.append(
            f"{way.label:<24} {spread([t.resumed_seconds for t in trials]):>26} "
            f"{spread([float(t.steps_again) for t in trials], ''):>18} {spread([t.caught_up_seconds for t in trials]):>20} "
            f"{spread([t.total_seconds for t in trials]):>20}"
        )
    return "\n".join(lines)


def plot(results: dict[Way, list[Trial]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    for index, (way, trials) in enumerate(results.items()):
        seconds = [t.resumed_seconds for t in trials]
        axis.scatter([index] * len(seconds), seconds, color="tab:blue")
        axis.hlines(statistics.median(seconds), index - 0.25, index + 0.25, color="tab:red")
    axis.set_xticks(range(len(results)), [way.label for way in results])
    axis.set_ylabel("kill to first step after (s)")
    axis.set_ylim(bottom=0)
    axis.set_title(f"{SCRIPT.name}, {WORKERS} workers, rank {KILLED_RANK} killed (red: median)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="trials of each way (default 3)")
    parser.add_argument("--kill-at", type=int, default=100, help=f"kill once rank 0 logged this step (of {STEPS}; default 100)")
    parser.add_argument("--out", type=Path, help="write the table to OUT.txt and the plot to OUT.png")
    args = parser.parse_args()
    results: dict[Way, list[Trial]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeat):
            for way in WAYS:  # interleaved: the machine's drift falls on every way alike
                directory = Path(scratch) / f"{way.backend}-{way.elastic}-{repeat}"
                directory.mkdir()
                took = trial(way, directory, args.kill_at)
                results[way].append(took)
                print(
                    f"  {way.label}, trial {repeat + 1}: first step {took.resumed_seconds:.1f} s after the kill at "
                    f"{took.ranks_after} ranks, {took.steps_again} steps again, caught up after {took.caught_up_seconds:.1f} s, "
                    f"{took.total_seconds:.1f} s in all",
                    flush=True,
                )
    text = table(results)
    print(text)
    if args.out:
        args.out.with_suffix(".txt").write_text(f"python -m benchmarks.elastic_reform_bench --repeat {args.repeat} --kill-at {args.kill_at}\n\n{text}\n")
        print(f"written: {args.out.with_suffix('.txt')}; {draw(lambda path: plot(results, path), args.out.with_suffix('.png'))}")


if __name__ == "__main__":
    sys.exit(main())  # type: ignore[func-returns-value]  # main returns None: exit status 0
