"""What building Caramel's graph of several steps costs, against the backend's own graph of one step.

    python -m benchmarks.graph_build_bench --profiles densenet121,mobilenet_v2 --repeats 3
    python -m benchmarks.graph_build_bench --runtime-from /path/to/an/older/checkout/runtime   # that code's cost

No root: each run is a job of 2 workers through `caramel run` on this machine (no shaped link:
what is timed is building graphs, not moving bytes). Its training processes train an emulated
model (emulated_model.py, graph-ops kernels, gradients computed in the backward pass) through
`ctf.function` at 4 steps per graph, deciding as for a long training, so that the first measured
plan is built into Caramel's graph; rank 0 times every call. The table gives, per profile, the
median over the repeats (and their spread) of:
    own build     the own graph's first call beyond a steady execution (tracing the step,
                  TensorFlow's optimization of its graph, its first run)
    Caramel build the call that built Caramel's graph of several steps, beyond a steady execution
    builds        Caramel build over own build (what the replanner weighs a new graph at:
                  caramel.tensorflow.step_control.builds_of_caramels_graph)
    steady        an execution's median time once both are built
--runtime-from puts another checkout's `runtime` first on the training processes' path, so that
code's build is measured beside this one's on the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import yaml

if TYPE_CHECKING:
    from caramel.tensorflow.steps import StepFunction

REPOSITORY = Path(__file__).resolve().parent.parent
CALL = "caramel-graph-build call"
STEPS_PER_EXECUTION = 4
CALLS = 8
"""Enough for the own graph's first calls, the first plan's build (its third or fourth call) and
steady executions after it."""


def train(profile_name: str, calls: int) -> None:
    """The training process: `calls` calls of a ctf.function over the emulated model, each timed."""
    import tensorflow as tf

    import caramel.tensorflow as ctf
    from benchmarks import emulated_model
    from benchmarks.loops import training_step
    from benchmarks.profiles import load_profile
    from caramel.planner.policy import PlanningPolicy
    from caramel.tensorflow.runtime import plan_with

    plan_with(PlanningPolicy(long_training=True))  # its few calls stand for a long training's first ones
    ctf.init()
    model = emulated_model.build_model(load_profile(profile_name))
    optimizer = tf.keras.optimizers.SGD(1e-9)
    optimizer.build(model.trainable_variables)
    ctf.broadcast_variables([*model.variables, *optimizer.variables], root_rank=0)
    steps = cast("StepFunction", ctf.function(training_step(model, optimizer, emulated_model.loss, ctf.DistributedGradientTape), steps_per_execution=STEPS_PER_EXECUTION))  # given a step
    iterator = iter(emulated_model.dataset().prefetch(STEPS_PER_EXECUTION))
    for call in range(calls):
        started = time.perf_counter()
        float(steps(iterator)[-1])  # the execution has ended once its last loss exists
        if ctf.rank() == 0:
            print(f"{CALL} {call}: {time.perf_counter() - started:.3f}", flush=True)


def run_job(profile: str, runtime_from: Path | None, directory: Path) -> list[float]:
    """One job's call times, from rank 0's lines."""
    env = [{"name": "PYTHONPATH", "value": os.pathsep.join(filter(None, [str(runtime_from or ""), str(REPOSITORY)]))}]
    job = {
        "apiVersion": "caramel.dev/v1alpha1",
        "kind": "CaramelJob",
        "metadata": {"name": f"graph-build-{profile.replace('_', '-')}"},
        "spec": {
            "command": [sys.executable, "-m", "benchmarks.graph_build_bench", "--train", profile],
            "env": env,
            "workers": {"replicas": 2},
            "caramel": {"backend": "horovod"},
            "runPolicy": {"backoffLimit": 0},
        },
    }
    job_file = directory / f"{profile}.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = subprocess.run([sys.executable, "-m", "caramel.launch.cli", "run", str(job_file)], capture_output=True, text=True, cwd=REPOSITORY)
    times = [float(line.rsplit(":", 1)[1]) for line in done.stdout.splitlines() + done.stderr.splitlines() if CALL in line]
    if done.returncode != 0 or len(times) != CALLS:
        raise SystemExit(f"graph_build_bench: the {profile} job failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return times


def costs(times: list[float]) -> tuple[float, float, float]:
    """(own build, Caramel build, steady execution) from one job's call times: the first call
    built the own graph; the longest later one built Caramel's; the last three are steady."""
    steady = statistics.median(times[-3:])
    return times[0] - steady, max(times[1:]) - steady, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="densenet121", help="comma-separated profiles of benchmarks/profiles")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runtime-from", type=Path, help="a checkout's runtime directory, first on the training processes' path")
    parser.add_argument("--train", metavar="PROFILE", help=argparse.SUPPRESS)  # the training process's side
    args = parser.parse_args()
    if args.train:
        train(args.train, CALLS)
        return
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for profile in args.profiles.split(","):
            runs = []
            for repeat in range(args.repeats):
                print(f"{profile}: run {repeat + 1} of {args.repeats}", file=sys.stderr, flush=True)
                runs.append(costs(run_job(profile, args.runtime_from, Path(directory))))
            rows.append((profile, runs))
    print(f"\n{'profile':<16} {'own build s':>18} {'Caramel build s':>18} {'builds':>16} {'steady s':>8}")
    for profile, runs in rows:
        own, caramel, steady = zip(*runs)
        ratios = [c / o for o, c in zip(own, caramel)]

        def cell(values: tuple[float, ...] | list[float]) -> str:
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        print(f"{profile:<16} {cell(own):>18} {cell(caramel):>18} {cell(ratios):>16} {statistics.median(steady):>8.2f}")


if __name__ == "__main__":
    main()
