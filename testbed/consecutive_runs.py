"""Run one job many times in a row and stop at the first run that does not succeed.

    python -m testbed.consecutive_runs                                          # the quickstart, 4 workers, 20 runs
    python -m testbed.consecutive_runs examples/quickstart.yaml --workers 4 --runs 20

A slow start shows up only now and then (TensorFlow's coordination service once declared a rank
dead that had got no CPU for 10 s, in about one run in ten of a 4-rank job on 2 cores), so a
fix is shown by many runs in a row, each a whole `caramel run` of the job with
spec.runPolicy.backoffLimit as the job sets it. Prints one line per run (its outcome and wall
time, and the 1-minute load average when it started); after a run that did not succeed, its
last lines, and its whole output goes to a file. Exits 1 unless every run succeeded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAST_LINES_SHOWN = 40
RUN_TIMEOUT_SECONDS = 1800


def run_once(job: Path, workers: int) -> tuple[bool, float, str]:
    """One `caramel run` of the job: whether it succeeded, its wall time and its output."""
    started = time.monotonic()
    command = [sys.executable, "-m", "caramel.launch.cli", "run", str(job), "--workers", str(workers)]
    try:
        result = subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stderr or b"").decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
        return False, time.monotonic() - started, f"{output}\n(timed out after {RUN_TIMEOUT_SECONDS} s)"
    return result.returncode == 0, time.monotonic() - started, result.stdout + result.stderr


def main(argv: list[str] | None = None, say: Callable[[str], None] = lambda text: print(text, flush=True)) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", nargs="?", type=Path, default=REPO / "examples" / "quickstart.yaml", help="a CaramelJob (default: the quickstart)")
    parser.add_argument("--workers", type=int, default=4, help="workers of the job, each a local process (default 4)")
    parser.add_argument("--runs", type=int, default=20, help="runs in a row (default 20)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")
    job = args.job.resolve()
    say(f"# {args.runs} runs of {job} with {args.workers} workers on {os.cpu_count()} cores")
    for number in range(1, args.runs + 1):
        load = os.getloadavg()[0]
        succeeded, seconds, output = run_once(job, args.workers)
        say(f"run {number}/{args.runs}: {'Succeeded' if succeeded else 'FAILED'} in {seconds:.1f} s (load {load:.1f})")
        if not succeeded:
            with tempfile.NamedTemporaryFile("w", prefix=f"consecutive-run-{number}-", suffix=".log", delete=False) as log:
                log.write(output)
            say(f"its last lines (all of them in {log.name}):")
            for line in output.splitlines()[-LAST_LINES_SHOWN:]:
                say(f"  | {line}")
            say(f"{number - 1} of {args.runs} runs succeeded before run {number} failed")
            return 1
    say(f"all {args.runs} runs succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
