"""How soon the operator restarts a gang, measured against kmock's Kubernetes API emulator (not a
timed test).

    python -m benchmarks.operator_restart [--repeat 3]

With the operator's default settings, for each placement (R-Storm, the default, and the
scheduler) and each way a worker goes (its pod deleted, its container crashed): a job of two
workers runs, worker 1 goes, and the time is taken from that moment until the job is Restarting
and until every pod of the new gang exists (testbed/restart_timing.py). Each trial has an
emulator and an operator of its own. This is the operator's part: on a cluster, the deleted pod
and its peers first take their time to stop, and the new pods theirs to start. Prints a line per
trial and a table; run with the project's virtualenv.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from testbed.operator_harness import Emulator, Operator
from testbed.restart_timing import DEFAULT_TIMINGS, WAYS, Restart, RestartClock

SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"], "workers": {"replicas": 2}}
PLACEMENTS = ("RStorm", "Scheduler")


def trial(placement: str, way: str, directory: Path) -> Restart:
    """One trial, on an emulator and operator of its own: kmock's emulator answers more slowly
    the more requests it has served (it keeps them all), which a shared one adds to each trial."""
    emulator = Emulator(directory)
    operator = Operator(emulator, directory, **DEFAULT_TIMINGS)
    clock = RestartClock(emulator.api)
    try:
        return clock.time("demo", {**SPEC, "placement": {"policy": placement}}, way)
    finally:
        clock.close()
        operator.stop()
        emulator.stop()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="trials of each placement and way (default 3)")
    args = parser.parse_args()
    results: dict[tuple[str, str], list[Restart]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.repeat):
            for placement in PLACEMENTS:
                for way in WAYS:
                    name = f"{placement.lower()}-{way}-{run}"
                    (Path(scratch) / name).mkdir()
                    took = trial(placement, way, Path(scratch) / name)
                    results.setdefault((placement, way), []).append(took)
                    print(f"  {name}: Restarting after {took.restarting:.2f} s, the new gang's pods after {took.created:.2f} s", flush=True)
    print()
    print(f"default settings ({', '.join(f'{k}={v}' for k, v in DEFAULT_TIMINGS.items())}), median (min-max) of {args.repeat}:")
    print("| placement | worker 1 | to Restarting | to the new gang's pods |")
    print("| --- | --- | --- | --- |")
    for (placement, way), taken in results.items():
        print(f"| {placement} | {way} | {spread([t.restarting for t in taken])} | {spread([t.created for t in taken])} |")


if __name__ == "__main__":
    main()
