"""The model zoo: Caramel against Horovod (and TensorFlow's MultiWorkerMirroredStrategy where a strategy runs on TensorFlow's collectives) on models the benchmark was not tuned on, in three compute modes.

    sudo make bench-zoo                                              # every profile at 1 and 4 Gbit/s, 3 repeats
    python -m benchmarks.zoo_bench --profiles regimes --rates 1000,4000 --repeats 3          # one profile per regime
    python -m benchmarks.zoo_bench --mode device-clock --profiles densenet121 --rates 1000
    python -m benchmarks.zoo_bench --mode h200 --rates 1000,2500     # H200 timelines x10 on links /10: 10 and 25 GbE
    python -m benchmarks.zoo_bench --calibrate --profiles vit_b16    # measure operating points (zoo_points.json)
    python -m benchmarks.zoo_bench --job-steps 200 --profiles resnet50,densenet121,t5_small --rates 4000
    python -m benchmarks.zoo_bench --report runs/zoo-<time>/results.json
    python -m benchmarks.zoo_bench --report runs/zoo-a/results.json runs/zoo-b/results.json --output runs/zoo-joined

Runs need root and the project's virtualenv, like `make bench` (benchmarks/README.md): 4 workers,
each in its own network namespace, tbf-shaped links, an emulated accelerator per profile
(benchmarks/profiles/, emulated_model.py), real collectives (Horovod's over Gloo, TensorFlow's
over gRPC). The compute runs in one of three modes (--mode):
    graph-ops     each layer's forward and backward are ops of the step's graph that sleep their
                  time where they run (the default): a wait the graph adds is never made up
    device-clock  the same layers on one emulated device's clock, which makes late wake-ups up on
                  later sleeps (the mode of the results before the overlap issue), kept beside
                  graph-ops to show what it hides
    h200          real accelerator timelines (accelerator_timelines.py): every gradient released at
                  its time measured on an NVIDIA H200, every time multiplied by --time-scale k and
                  the link taken as k times faster than --rates (k = 10: 1000 Mbit/s stands for
                  10 GbE, 2500 for 25 GbE); the layers run as graph-ops
--profiles names profiles, or `regimes` for REGIME_PROFILES, one profile of each regime (the
subset the zoo runs where the whole zoo would take too long); the h200 mode's profiles are the
timelines (default: all of them).

In the graph-ops and device-clock modes every profile is measured at its operating point at each
link rate: the emulated device is as fast as makes its compute C equal to the communication M
at that rate, where overlap matters most. The operating points come from benchmarks/zoo_points.json,
which --calibrate writes (in the graph-ops mode; device-clock runs at the same device rates):
per profile, compute-only at the profile's own device rate (C0) and comm-only at each rate (M:
plain Horovod's allreduce of every gradient at once), and the device rate that scales C0 to M.
The h200 mode needs no calibration: its operating points are the links the timelines stand for.
Each point then runs, repeats interleaved, each strategy in worker processes of its own:
    horovod-tape          plain Horovod's tape in a tf.function called once per step (its TF2
                          examples; Caramel's horovod package bypassed, plain_horovod.py)
    hvd-script            the same loop unchanged under Caramel (its `import horovod.tensorflow`
                          is Caramel's)
    caramel-tape          Caramel's tape in the same per-step tf.function (import swapped)
    caramel-function      Caramel's tape through ctf.function, several steps per graph
    caramel               Keras fit with ctf.DistributedOptimizer and TrainingCallback, compiled with
                          the run's steps_per_execution
    caramel-fit-plain     the same fit compiled without steps_per_execution, as Horovod's Keras
                          examples compile it: Caramel chooses the steps per graph
the last five on Caramel's default backend (auto: Horovod's collectives where Horovod is
installed). horovod-tape (and mwms-fit, MultiWorkerMirroredStrategy's Keras fit, where a strategy
runs on TensorFlow's collectives) always run as BASELINES; --strategies adds any of
scheduling_bench's (the @tf and @hvd paths, autotune-tape, mwms-loop, the anchors). Compute-only
and comm-only run once per point, for C, M and the bounds of the layers' release and read order
(step_bounds.py), and comm-only-tf (the same all-reduce by MultiWorkerMirroredStrategy:
TensorFlow's M) where a strategy runs on TensorFlow's collectives. Each strategy is bounded with
the M of the backend that moves its gradients.

One table per baseline gives per point C, M, C + M and the baseline's step (median and min-max
over the runs), every other strategy's step over it (and its runs' min-max), and the best Caramel
path over the bound of any schedule and over the CPU floor of any schedule (compute-only's and
comm-only's CPU per step, every rank's, over the cores the ranks share); a table of Caramel's runs
gives per point and Caramel strategy its step over C + M beside the baseline's, over its bound and
over its own CPU floor (its CPU per step, every rank's, over the cores), what the plan predicted
against what the plan's steps measured, the way each run ended on (P the plan, H the backend's
own way in Caramel's graph, as its selector measured, G the backend's own graph of one step, as
the graph choice measured, - a per-step path, which runs the backend's own way), and CPU per
step and peak RSS over each baseline's. Summary lines give, per baseline, every strategy's
geometric mean over the zoo, the range of its points, and its worst point; zoo.png has a panel
per baseline, a bar group per model and a bar per strategy (its ratio to the baseline), with a
line at 1.0.

--job-steps N runs each strategy for N steps from a cold start and reports the whole run's wall
time (start-up, traces, re-plans and all) against each baseline's: what a short job pays.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import cast

from caramel.contract.api import MemoryAllocator

from benchmarks.jobrun import REPOSITORY, bench_job, hostnames
from benchmarks.netem import DEFAULT_PREFIX, DEFAULT_SUBNET, EmulatedCluster, HarnessError
from benchmarks.plots import draw
from benchmarks.accelerator_timelines import BASE_RATE, is_timeline, timeline_names
from benchmarks.profiles import NAMES, Profile
from benchmarks.scheduling_bench import (
    BASELINES,
    COMM_ONLY,
    JOB_NAME,
    MEASURED_EXECUTIONS,
    STRATEGIES,
    TENSORFLOW,
    Bench,
    Cell,
    Point,
    Run,
    backend_of,
    caramel_strategies,
    comm_strategies,
    parse_rates,
    parse_strategies,
    parse_worker_env,
)
from benchmarks.step_bounds import ordered_bounds
from benchmarks.workloads import COMPUTED, DEVICE_CLOCK, GRADIENTS, GRAPH_OPS, Workload, make_workloads, warmup_steps

ZOO_POINTS = Path(__file__).resolve().parent / "zoo_points.json"
DEFAULT_RATES = (1000.0, 4000.0)
DEFAULT_STRATEGIES = ("horovod-tape", "hvd-script", "caramel-tape", "caramel-function", "caramel", "caramel-fit-plain")
BASELINE = BASELINES[0]
"""The baseline of the ratios where none is named: plain Horovod's tape, whose M calibrated the points."""
OWN_GRAPH = "own"
"""caramel.tensorflow.graph_choice.OWN_GRAPH, as the workers report it (the driver imports no TensorFlow)."""
# What each profile stands for in the zoo.
REGIMES = {
    "resnet50": "deep residual",
    "vgg16": "few huge tensors",
    "bert_base": "giant embedding",
    "densenet121": "many tiny tensors",
    "mobilenet_v2": "many tiny tensors",
    "mobilenet_v3_large": "many tiny tensors",
    "efficientnet_b0": "many tiny tensors",
    "nasnet_mobile": "many tiny tensors",
    "inception_v3": "wide convnet",
    "xception": "separable convnet",
    "resnet152_v2": "deep residual",
    "convnext_tiny": "modern convnet",
    "vgg19": "few huge tensors",
    "gpt2_small": "giant embedding",
    "t5_small": "giant embedding",
    "vit_b16": "vision transformer",
}
assert set(REGIMES) == set(NAMES), "every profile has a regime"
TIMELINE_MODELS = {
    "h200_resnet50": "resnet50", "h200_vgg16": "vgg16", "h200_densenet121": "densenet121", "h200_mobilenet_v2": "mobilenet_v2",
    "h200_convnext_tiny": "convnext_tiny", "h200_vit_b_16": "vit_b16", "h200_gpt2": "gpt2_small",
}  # fmt: skip
"""The zoo profile of the same model as each timeline, whose regime it shares."""
REGIME_PROFILES = tuple(next(name for name in REGIMES if REGIMES[name] == each) for each in dict.fromkeys(REGIMES.values()))
"""One profile of each regime, the first REGIMES names for it: the subset `--profiles regimes` runs."""
MODES = ("graph-ops", "device-clock", "h200")
H200_RATES = (1000.0, 2500.0)
"""The h200 mode's default links: 10 and 25 GbE at the default --time-scale 10."""
DEFAULT_TIME_SCALE = 10.0
CALIBRATION_STEPS, CALIBRATION_WARMUP = 12, 4
# The best path's step within this much of the bound of any schedule counts as near it.
NEAR_BOUND = 1.15


def point_key(profile: str, rate_mbit: float) -> str:
    return f"{profile}@{rate_mbit:g}"


# -- calibration --------------------------------------------------------------------------------


def calibrate(bench: Bench, workloads: list[Workload], rates: list[float], points: dict) -> None:
    """C0 at each profile's own device rate, M at each rate, and the device rate for C = M."""
    for workload in workloads:
        compute = bench.run(workload, "compute-only", rates[0], 0, steps=CALIBRATION_STEPS, warmup=CALIBRATION_WARMUP)
        for rate in rates:
            comm = bench.run(workload, "comm-only", rate, 0, steps=CALIBRATION_STEPS, warmup=CALIBRATION_WARMUP)
            c0, m = compute.step_seconds, comm.step_seconds
            if math.isnan(c0) or math.isnan(m):
                bench.say(f"{workload.name} at {rate:g} Mbit/s: not calibrated (a run failed)")
                continue
            device = cast(float, workload.device_tflops) * c0 / m  # the zoo's workloads are emulated
            points.setdefault(workload.name, {})[f"{rate:g}"] = {"device_tflops": device, "compute_seconds": c0, "comm_seconds": m}
            bench.say(f"{workload.name} at {rate:g} Mbit/s: C0 {c0:.3f} s at {workload.device_tflops:.3g} TFLOP/s, M {m:.3f} s: "
                      f"operating point {device:.3g} TFLOP/s")  # fmt: skip
            save_points(points, bench.args)


def save_points(points: dict, args: argparse.Namespace) -> None:
    """The points, and every calibration that measured some of them (a run calibrates the
    profiles and rates it was given; the others keep what an earlier one measured)."""
    this = f"{time.strftime('%Y-%m-%d')}, commit {commit()}: " + " ".join(["python -m benchmarks.zoo_bench", *args.argv])
    earlier = json.loads(ZOO_POINTS.read_text()).get("calibrations", []) if ZOO_POINTS.is_file() else []
    document = {
        "calibrations": list(dict.fromkeys([*earlier, this])),
        "method": "device_tflops = the profile's own rate x C0 / M: C0 compute-only at the profile's own rate, M comm-only",
        "points": points,
    }
    ZOO_POINTS.write_text(json.dumps(document, indent=1) + "\n")


def h200_points(names: list[str], rates: list[float], time_scale: float) -> dict:
    """The h200 mode's points: every timeline `time_scale` times slower than the H200, at each rate."""
    return {name: {f"{rate:g}": {"device_tflops": BASE_RATE / time_scale} for rate in rates} for name in names}


def load_points() -> dict:
    if not ZOO_POINTS.is_file():
        return {}
    return json.loads(ZOO_POINTS.read_text())["points"]


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=False)
    return result.stdout.strip() or "unknown"


# -- the zoo ------------------------------------------------------------------------------------


def measure(bench: Bench, workload: Workload, rate: float, strategies: tuple[str, ...], repeats: int) -> Point:
    """Every strategy at the point, repeats interleaved, and compute-only and the comm-only runs
    (Horovod's, and TensorFlow's where a strategy runs on it) once."""
    point = Point(
        rate, workload.device_tflops, measured=f"{time.strftime('%Y-%m-%d %H:%M')}, commit {commit()}", workers=bench.args.workers, cores=len(os.sched_getaffinity(0))
    )
    for repeat in range(repeats):
        for strategy in strategies:
            point.cells.setdefault(strategy, Cell()).runs.append(bench.run(workload, strategy, rate, repeat))
    for strategy in ("compute-only", *comm_strategies(strategies)):
        point.cells[strategy] = Cell([bench.run(workload, strategy, rate, 0)])
    return point


def ratio(point: Point, strategy: str, baseline: str = BASELINE) -> float:
    return point.median(strategy) / point.median(baseline)


def point_backend(results: dict[str, Point], strategy: str) -> str:
    """The backend that moved the strategy's gradients (as the first point that ran it says)."""
    return next((point.backend_of(strategy) for point in results.values() if strategy in point.cells), backend_of(strategy))


def baselines_needed(strategies: tuple[str, ...]) -> list[str]:
    """Horovod's tape always; MultiWorkerMirroredStrategy's fit where a strategy runs on
    TensorFlow's collectives, which it is the baseline of."""
    on_tensorflow = any(backend_of(name) == TENSORFLOW for name in strategies)
    return [name for name in BASELINES if name == BASELINE or on_tensorflow]


def baselines_of(strategies: tuple[str, ...]) -> list[str]:
    """The baselines among the strategies, in BASELINES' order."""
    return [name for name in BASELINES if name in strategies]


def compared(strategies: tuple[str, ...], baseline: str) -> list[str]:
    """What is set against `baseline`: every other strategy, but not a baseline set before it
    (mwms-fit over horovod-tape, not the other way too)."""
    baselines = baselines_of(strategies)
    earlier = baselines[: baselines.index(baseline)] if baseline in baselines else []
    return [name for name in strategies if name != baseline and name not in earlier]


def caramel_paths(strategies: tuple[str, ...]) -> list[str]:
    return caramel_strategies(strategies)


def best_path(point: Point, strategies: tuple[str, ...]) -> str | None:
    measured = [name for name in caramel_paths(strategies) if not math.isnan(point.median(name))]
    return min(measured, key=point.median) if measured else None


def bound_of_any_schedule(point: Point, workload: Workload, strategy: str) -> float:
    """The bound of any schedule (step_bounds.py) with the M of the strategy's backend."""
    compute, comm = point.median("compute-only"), point.comm(point.backend_of(strategy))
    if math.isnan(compute) or math.isnan(comm):
        return math.nan
    return ordered_bounds(cast(Profile, workload.profile), compute, comm).any_schedule  # the zoo's workloads are emulated


def cpu_bound_of_any_schedule(point: Point, strategy: str) -> float:
    """The least step the cores allow any schedule: the CPU per step of the compute alone and of
    the strategy's backend's communication alone (comm-only), on the cores the ranks share
    (Point.cpu_floor). Where the collectives' own CPU keeps the cores busy, it can bind above the
    bound of any schedule, which takes the link's rate to be the same with the compute beside it
    as without."""
    return point.cpu_floor("compute-only", COMM_ONLY[point.backend_of(strategy)])


def planner_error(cell: Cell) -> float:
    """The plan's predicted step over what the plan's own steps measured, median over the runs
    (NaN where no run measured its plan)."""
    values = [
        run.details["predicted_step_seconds"] / run.details["planned_step_seconds"]
        for run in cell.runs
        if run.details.get("predicted_step_seconds") and run.details.get("planned_step_seconds")
    ]
    return statistics.median(values) if values else math.nan


def plan_link(cell: Cell, point: Point) -> float:
    """The link the runs' last plans were made for over the link the point shapes, median over the
    runs that report it (NaN where none does: no plan, or a run from before it was reported).
    Beside the planner's error: a plan made for a faster link than its steps get predicts too
    fast a step, and the estimate moves from run to run on one point."""
    shaped_bytes_per_second = point.rate_mbit * 1e6 / 8
    values = [run.details["plan_bytes_per_second"] / shaped_bytes_per_second for run in cell.runs if run.details.get("plan_bytes_per_second")]
    return statistics.median(values) if values else math.nan


def arms(cell: Cell) -> str:
    """How each run's steps ran at the end: P the plan, H the backend's own way in Caramel's graph,
    G the backend's own graph of one step (graph_choice.py; "horovod" in runs before the backends),
    - a per-step path (a tf.function the script calls once per step), which runs the backend's own way."""
    return "".join(
        "G" if run.details.get("graph") in (OWN_GRAPH, "horovod") else {True: "P", False: "H"}.get(run.details.get("planned"), "-")  # type: ignore[arg-type]  # not reported (None): "-"
        for run in cell.runs
    )


def regime(name: str) -> str:
    """What a profile stands for in the zoo; a timeline's is its model's."""
    return REGIMES.get(name) or REGIMES.get(TIMELINE_MODELS.get(name, ""), "measured timeline")


def device_cell(point: Point, name: str) -> str:
    """The point's device: its rate, or how much slower than the measured accelerator it runs."""
    return f"x{BASE_RATE / cast(float, point.device_tflops):.3g}" if is_timeline(name) else f"{point.device_tflops:.3g}"


def of_compute_and_comm(point: Point, strategy: str) -> float:
    """The strategy's step over C + M (with the M of its backend): 1 is no overlap at all."""
    return point.median(strategy) / (point.median("compute-only") + point.comm(point.backend_of(strategy)))


def ratio_cell(point: Point, strategy: str, baseline: str, width: int = 22) -> str:
    """The strategy's median step over the baseline's, and its runs' min-max over the same."""
    value = ratio(point, strategy, baseline)
    if math.isnan(value):
        return f"{'failed' if strategy in point.cells else 'not run':^{width}}"
    low, high = point.cells[strategy].spread
    reference = point.median(baseline)
    return f"{value:6.3f} ({low / reference:.3f}-{high / reference:.3f})".ljust(width)


def print_table(results: dict[str, Point], workloads: dict[str, Workload], strategies: tuple[str, ...]) -> None:
    """One table per baseline that ran (each point's baseline step, every other strategy's over
    it, and the best Caramel path over the bound of any schedule, with the M of its backend, and
    over the CPU floor of any schedule), then one of Caramel's runs: per point and Caramel
    strategy its step over its bound and over its own CPU floor (its CPU per step on the cores),
    the plan's predicted step over what its steps measured, the link the last plan was made for
    over the shaped one, the way each run ended on, and peak RSS and CPU per step over each
    baseline's."""
    for baseline in baselines_of(strategies):
        others = compared(strategies, baseline)
        comm = COMM_ONLY[point_backend(results, baseline)]
        print(f"\nstep over {baseline}'s: median (min-max over the runs); M is {comm}'s; best/bnd is the best Caramel path "
              "over the bound of any schedule, best/cpu over the CPU floor of any schedule (compute-only's and "
              f"{comm}'s CPU per step, every rank's, over the cores)")  # fmt: skip
        titles = {name: f"{name} /{baseline[0].upper()}" for name in others}
        widths = {name: max(22, len(title)) for name, title in titles.items()}
        header = (
            f"{'profile':18} {'regime':18} {'Mbit/s':>6} {'device':>7} {'C':>6} {'M':>6} {'C+M':>6} | {baseline + ' s':^22} | "
            + " | ".join(f"{title:^{widths[name]}}" for name, title in titles.items())
            + f" | {'best/bnd':>8} {'best/cpu':>8}"
        )
        print(header)
        print("-" * len(header))
        for key, point in results.items():
            name = key.split("@")[0]
            best = best_path(point, strategies)
            bound = point.median(best) / bound_of_any_schedule(point, workloads[name], best) if best else math.nan
            cpu = point.median(best) / cpu_bound_of_any_schedule(point, best) if best else math.nan
            compute, communication = point.median("compute-only"), point.median(comm)
            print(
                f"{name:18} {regime(name):18} {point.rate_mbit:6g} {device_cell(point, name):>7} {compute:6.3f} "
                f"{communication:6.3f} {compute + communication:6.3f} | {point.cells.get(baseline, Cell()).describe()} | "
                + " | ".join(ratio_cell(point, other, baseline, widths[other]) for other in others)
                + f" | {bound:8.2f} {cpu:8.2f}"
            )
    paths = caramel_paths(strategies)
    if not paths:
        return
    baselines = baselines_of(strategies)
    print("\nCaramel's runs: step over C + M (its backend's M) beside each baseline's, over the bound of any schedule, "
          "over its own CPU floor (its CPU per step, every rank's, over the cores: 1.00 keeps every core busy), the "
          "plan's predicted step over what its steps measured, the link the last plan was made for over the shaped one, how "
          "each run ended (P the plan, H the backend's own way in Caramel's graph, G the backend's own graph of one step, - a "
          "per-step path), CPU per step and peak RSS over each baseline's")  # fmt: skip
    header = (
        f"{'profile':18} {'Mbit/s':>6} {'strategy':22} | {'/(C+M)':>6}"
        + "".join(f" {b[0].upper() + ' /(C+M)':>8}" for b in baselines)
        + f" | {'/bnd':>5} {'/cpu':>5} | {'pred/meas':>9} | {'link/rate':>9} | {'arms':>5}"
        + "".join(f" | {'CPU /' + b[0].upper():>7} {'RSS /' + b[0].upper():>7}" for b in baselines)
    )
    print(header)
    print("-" * len(header))
    for key, point in results.items():
        name = key.split("@")[0]
        for path in paths:
            cell = point.cells.get(path, Cell())
            of_bound = point.median(path) / bound_of_any_schedule(point, workloads[name], path)
            overlap = f"{of_compute_and_comm(point, path):6.3f}" + "".join(f" {of_compute_and_comm(point, b):8.3f}" for b in baselines)
            resources = "".join(
                f" | {cell.cpu_seconds_per_step / point.cells.get(b, Cell()).cpu_seconds_per_step:7.2f} "
                f"{(cell.peak_rss_bytes or math.nan) / (point.cells.get(b, Cell()).peak_rss_bytes or math.nan):7.2f}"
                for b in baselines
            )
            plan = f"{planner_error(cell):9.2f} | {plan_link(cell, point):9.2f} | {arms(cell):>5}"
            own_cpu = point.median(path) / point.cpu_floor(path)
            print(f"{name:18} {point.rate_mbit:6g} {path:22} | {overlap} | {of_bound:5.2f} {own_cpu:5.2f} | {plan}{resources}")


def geometric_mean(values: list[float]) -> float:
    values = [value for value in values if value > 0 and not math.isnan(value)]
    return math.exp(statistics.fmean(math.log(value) for value in values)) if values else math.nan


def print_summary(results: dict[str, Point], workloads: dict[str, Workload], strategies: tuple[str, ...]) -> None:
    """Per baseline and every strategy set against it: the geometric mean of its ratios over the
    points, their range, the points where it was at most as slow, and its worst point; then the
    best Caramel path's, how near the bound it came, and the planner's error."""
    print()
    for baseline in baselines_of(strategies):
        for strategy in compared(strategies, baseline):
            ratios = {key: ratio(point, strategy, baseline) for key, point in results.items()}
            ratios = {key: value for key, value in ratios.items() if not math.isnan(value)}
            if not ratios:
                continue
            worst = max(ratios, key=ratios.get)  # type: ignore[arg-type]  # .get of its own keys: never None
            print(
                f"{strategy}: geometric mean {geometric_mean(list(ratios.values())):.3f}x {baseline} over {len(ratios)} points "
                f"({min(ratios.values()):.3f}-{max(ratios.values()):.3f}); at most 1.0x on {sum(r <= 1.0 for r in ratios.values())}; "
                f"worst {ratios[worst]:.3f}x ({worst})"
            )
        best = {
            key: ratio(point, chosen, baseline)
            for key, point in results.items()
            if (chosen := best_path(point, strategies)) and not math.isnan(ratio(point, chosen, baseline))
        }
        if best:
            print(f"best Caramel path: geometric mean {geometric_mean(list(best.values())):.3f}x {baseline}; at most 1.0x on "
                  f"{sum(r <= 1.0 for r in best.values())} of {len(best)} points")  # fmt: skip
    near, near_either = [], []
    for key, point in results.items():
        name, chosen = key.split("@")[0], best_path(point, strategies)
        bound = bound_of_any_schedule(point, workloads[name], chosen) if chosen else math.nan
        if not math.isnan(bound):  # hence a chosen path
            near.append(point.median(cast(str, chosen)) / bound <= NEAR_BOUND)
            cpu = cpu_bound_of_any_schedule(point, cast(str, chosen))
            if not math.isnan(cpu):
                near_either.append(point.median(cast(str, chosen)) / max(bound, cpu) <= NEAR_BOUND)
    if near:
        print(f"best path within {NEAR_BOUND}x of the bound of any schedule on {sum(near)} of {len(near)} points")
    if near_either:
        print(f"best path within {NEAR_BOUND}x of the larger of that bound and the CPU floor of any schedule on {sum(near_either)} "
              f"of {len(near_either)} points where the cores were recorded")  # fmt: skip
    errors = [planner_error(point.cells.get(path, Cell())) for point in results.values() for path in caramel_paths(strategies)]
    errors = [abs(error - 1.0) for error in errors if not math.isnan(error)]
    if errors:
        seen = [plan_link(point.cells.get(path, Cell()), point) for point in results.values() for path in caramel_paths(strategies)]
        seen = [value for value in seen if not math.isnan(value)]
        link = f"; the link the plans were made for: {min(seen):.2f}-{max(seen):.2f} of the shaped rate" if seen else ""
        print(f"planner: predicted against measured off by {statistics.median(errors):.1%} (median over {len(errors)} points and paths){link}")


def plot(results: dict[str, Point], strategies: tuple[str, ...], path: Path) -> None:
    """One panel per baseline: a bar group per model (and link rate), a bar per strategy set
    against it, its step over the baseline's, with a line at 1.0."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    baselines = baselines_of(strategies)
    keys = list(results)
    colors = {name: f"C{index % 10}" for index, name in enumerate(strategies)}  # a strategy's colour in every panel
    widest = max((len(compared(strategies, baseline)) for baseline in baselines), default=1)
    figure, axes = plt.subplots(
        max(1, len(baselines)), 1, figsize=(max(8, 0.6 * len(keys) * max(1, widest)), 5 * max(1, len(baselines))), squeeze=False
    )
    for axis, baseline in zip(axes[:, 0], baselines):
        others = compared(strategies, baseline)
        width = 0.8 / max(1, len(others))
        for index, strategy in enumerate(others):
            positions = [i + (index - (len(others) - 1) / 2) * width for i in range(len(keys))]
            axis.bar(positions, [ratio(results[key], strategy, baseline) for key in keys], width, label=strategy, color=colors[strategy])
        axis.axhline(1.0, color="black", linewidth=1)
        axis.set_xticks(range(len(keys)), [key.replace("@", "\n") + " Mbit/s" for key in keys], rotation=90, fontsize=7)
        axis.set(ylabel=f"step time / {baseline}'s", title=f"against {baseline}, each model at its operating point")
        axis.legend(fontsize=8)
        axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def save_results(path: Path, results: dict[str, Point]) -> None:
    path.write_text(json.dumps({key: asdict(point) for key, point in results.items()}, indent=1, default=str))


def strategies_run(results: dict[str, Point]) -> tuple[str, ...]:
    """The strategies an earlier run measured, in the order it ran them (compute-only and the
    comm-only runs left out)."""
    names = [name for point in results.values() for name in point.cells]
    return tuple(dict.fromkeys(name for name in names if name != "compute-only" and name not in COMM_ONLY.values()))


def load_results(path: Path) -> dict[str, Point]:
    results = {}
    for key, document in json.loads(path.read_text()).items():
        cells = {name: Cell([Run(**run) for run in cell["runs"]]) for name, cell in document["cells"].items()}
        results[key] = Point(
            document["rate_mbit"], document["device_tflops"], cells, document.get("measured", ""), document.get("workers", 0), document.get("cores", 0)
        )
    return results


def load_reports(paths: list[Path]) -> dict[str, Point]:
    """The points of several runs' results.json as one zoo: the whole zoo does not fit one sitting,
    so it runs in parts. A point measured in two of them is refused, naming both, rather than one
    silently winning."""
    results: dict[str, Point] = {}
    origin: dict[str, Path] = {}
    for path in paths:
        for key, point in load_results(path).items():
            if key in results:
                raise ValueError(f"{key} is in both {origin[key]} and {path}: leave one of them out")
            results[key], origin[key] = point, path
    return results


def print_provenance(results: dict[str, Point]) -> None:
    print("\nmeasured: " + "; ".join(f"{key} {point.measured or 'when not recorded'}" for key, point in results.items()))


def report(args: argparse.Namespace) -> int:
    """The tables and plot of earlier runs, joined; with --output, the joined results.json and
    the plot go there (else the plot goes beside the first file)."""
    try:
        results = load_reports(args.report)
    except (OSError, ValueError, KeyError) as error:
        print(f"zoo_bench: --report: {error}", file=sys.stderr)
        return 2
    if not args.strategies_given:
        args.strategy_names = strategies_run(results)
    workloads = {key.split("@")[0]: make_workloads("emulated", [key.split("@")[0]], kernels=args.kernels, gradients=args.gradients)[0] for key in results}
    print_table(results, workloads, args.strategy_names)
    print_summary(results, workloads, args.strategy_names)
    print_provenance(results)
    plot_path = args.report[0].with_name("zoo.png")
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        save_results(args.output / "results.json", results)
        plot_path = args.output / "zoo.png"
    print("\n" + draw(lambda path: plot(results, args.strategy_names, path), plot_path))
    return 0


# -- short jobs ---------------------------------------------------------------------------------


def job_wall_times(bench: Bench, workload: Workload, rate: float, strategies: tuple[str, ...], steps: int, repeats: int) -> None:
    """Each strategy `repeats` times, interleaved, as a whole job of `steps` steps from a cold
    start (told its length): the median wall time and its spread, over each baseline's, and the
    spread of the time after the runs' last steps (their loops' end, summaries and exit)."""
    walls: dict[str, list[float]] = {strategy: [] for strategy in strategies}
    tails: dict[str, list[float]] = {strategy: [] for strategy in strategies}
    for repeat in range(repeats):
        for strategy in strategies:
            run = bench.run(workload, strategy, rate, repeat, steps=steps, warmup=0, whole_job=True)
            if not math.isnan(run.wall_seconds):
                walls[strategy].append(run.wall_seconds)
                tails[strategy].append(run.after_steps_seconds)
    baselines = [name for name in baselines_of(strategies) if walls[name]]
    for name in baselines_of(strategies):
        if not walls[name]:
            print(f"  {workload.name} at {rate:g} Mbit/s: every {name} run failed", flush=True)
    if not baselines:
        return
    medians = {name: statistics.median(seconds) for name, seconds in walls.items() if seconds}

    def wall(name: str) -> str:
        if not walls[name]:
            return f"{name} failed"
        return f"{name} {medians[name]:.0f} s ({min(walls[name]):.0f}-{max(walls[name]):.0f}; after the last step {min(tails[name]):.1f}-{max(tails[name]):.1f} s)"

    parts = [
        wall(name) + "".join(f", {medians[name] / medians[baseline]:.3f}x {baseline}" for baseline in baselines if baseline != name and name in medians)
        for name in strategies
    ]  # fmt: skip
    print(f"  {workload.name} at {rate:g} Mbit/s, {workload.device}: " + "; ".join(parts), flush=True)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the method.")
    parser.add_argument(
        "--mode", choices=MODES, default=MODES[0],
        help="how the compute runs: graph-ops (the default), device-clock, or h200 (measured timelines); see the module docstring",
    )  # fmt: skip
    parser.add_argument(
        "--profiles",
        help=f"comma-separated profiles, or `regimes` ({','.join(REGIME_PROFILES)}) (default: the whole zoo, {len(NAMES)}; in the "
        f"h200 mode, every timeline: {','.join(timeline_names())})",
    )  # fmt: skip
    parser.add_argument(
        "--rates",
        help=f"link rates in Mbit/s (default {','.join(f'{rate:g}' for rate in DEFAULT_RATES)}; in the h200 mode "
        f"{','.join(f'{rate:g}' for rate in H200_RATES)}, which stand for 10 and 25 GbE at --time-scale {DEFAULT_TIME_SCALE:g})",
    )  # fmt: skip
    parser.add_argument(
        "--time-scale", type=float, default=DEFAULT_TIME_SCALE,
        help=f"the h200 mode's k: every time of a timeline multiplied by k, for links k times slower than the ones they stand for "
        f"(default {DEFAULT_TIME_SCALE:g})",
    )  # fmt: skip
    parser.add_argument(
        "--gradients", choices=GRADIENTS, default=COMPUTED,
        help=f"how the emulated gradients are made: {', '.join(GRADIENTS)} (default {COMPUTED}; emulated_model.py)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="runs per strategy and point (default 3)")
    parser.add_argument(
        "--steps", type=int, default=16,
        help=f"measured steps per run, at least {MEASURED_EXECUTIONS} executions of --steps-per-execution (default 16); every "
        "run first runs the warm-up of make bench: until Caramel runs what its first rounds chose, 40 steps at 4 per execution",
    )  # fmt: skip
    parser.add_argument("--steps-per-execution", type=int, default=4, help="steps per graph execution (default 4)")
    parser.add_argument(
        "--strategies",
        help=f"comma-separated, from {', '.join(STRATEGIES)}; {' and '.join(BASELINES)} always run (default "
        f"{','.join(DEFAULT_STRATEGIES)}; with --report, the run's own)",
    )  # fmt: skip
    parser.add_argument("--calibrate", action="store_true", help=f"measure the operating points into {ZOO_POINTS.name}, and run nothing else")
    parser.add_argument("--job-steps", type=int, help="instead of the zoo: whole wall time of a job of this many steps, per strategy")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--worker-env", metavar="NAME=VALUE", action="append", default=[],
        help="an environment variable for every worker of every strategy, such as HOROVOD_TIMELINE=<file> (rank 0 writes it); repeatable",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, help="directory for logs and results (default runs/zoo-<time>)")
    parser.add_argument(
        "--report", type=Path, nargs="+", metavar="RESULTS_JSON",
        help="print the table of earlier runs' results.json, joined (a zoo run in parts), with when and at which commit each point "
        "was measured, and draw their plot (zoo.png) beside the first, or with --output write both there; run nothing",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    known = timeline_names() if args.mode == "h200" else NAMES
    if args.profiles == "regimes" and args.mode != "h200":
        args.profile_names = list(REGIME_PROFILES)
    else:
        args.profile_names = [name.strip() for name in args.profiles.split(",") if name.strip()] if args.profiles else list(known)
    unknown = [name for name in args.profile_names if name not in known]
    if unknown or not args.profile_names:
        parser.error(f"--profiles: unknown {', '.join(unknown) or '(none given)'} in the {args.mode} mode (known: {', '.join(known)})")
    if args.time_scale <= 0:
        parser.error(f"--time-scale: must be above 0, got {args.time_scale:g}")
    if args.calibrate and args.mode != "graph-ops":
        parser.error(f"--calibrate: the operating points are calibrated in the graph-ops mode (the {args.mode} mode " + (
            "needs none: its points are the links the timelines stand for)" if args.mode == "h200" else "runs at the same device rates)"
        ))  # fmt: skip
    default_rates = H200_RATES if args.mode == "h200" else DEFAULT_RATES
    args.rate_list = parse_rates(parser, args.rates or ",".join(f"{rate:g}" for rate in default_rates))
    args.kernels = DEVICE_CLOCK if args.mode == "device-clock" else GRAPH_OPS
    args.strategies_given = args.strategies is not None
    names = parse_strategies(parser, args.strategies, args.report is not None) if args.strategies_given else DEFAULT_STRATEGIES
    args.strategy_names = names if args.report else tuple(dict.fromkeys([*baselines_needed(names), *names]))
    for flag, value in (("--repeats", args.repeats), ("--steps", args.steps), ("--steps-per-execution", args.steps_per_execution), ("--workers", args.workers)):
        if value < 1:
            parser.error(f"{flag}: must be at least 1, got {value}")
    if args.steps < MEASURED_EXECUTIONS * args.steps_per_execution:
        parser.error(
            f"--steps: {args.steps} steps are fewer than {MEASURED_EXECUTIONS} executions of --steps-per-execution "
            f"{args.steps_per_execution}; a run's median step would then be decided by one execution"
        )
    if args.job_steps is not None and args.job_steps < 1:
        parser.error(f"--job-steps: must be at least 1, got {args.job_steps}")
    try:
        args.worker_env = [parse_worker_env(setting) for setting in args.worker_env]
    except ValueError as error:
        parser.error(f"--worker-env: {error}")
    # What scheduling_bench's Bench reads.
    args.compute, args.warmup, args.run_timeout = "emulated", warmup_steps(args.steps_per_execution), None
    args.autotune_warmup, args.memory_allocator = 65, MemoryAllocator.TCMALLOC.value
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report(args)
    if os.geteuid() != 0:
        print("zoo_bench needs root: it builds network namespaces, veths, a bridge, tc shaping and an iptables rule", file=sys.stderr)
        return 2
    points = h200_points(args.profile_names, args.rate_list, args.time_scale) if args.mode == "h200" else load_points()
    if not args.calibrate:
        missing = [point_key(name, rate) for name in args.profile_names for rate in args.rate_list if f"{rate:g}" not in points.get(name, {})]
        if missing:
            print(f"zoo_bench: no operating point for {', '.join(missing)} in {ZOO_POINTS}: run with --calibrate first", file=sys.stderr)
            return 2
    output = args.output or REPOSITORY / "runs" / time.strftime("zoo-%Y%m%d-%H%M%S")
    output.mkdir(parents=True, exist_ok=True)
    names = hostnames(bench_job(JOB_NAME, ["true"], args.workers, None))
    results: dict[str, Point] = {}
    workloads = {name: make_workloads("emulated", [name], kernels=args.kernels, gradients=args.gradients)[0] for name in args.profile_names}
    try:
        with EmulatedCluster(args.workers, args.rate_list[0], DEFAULT_PREFIX, DEFAULT_SUBNET, names) as cluster:
            bench = Bench(args, cluster, output)
            bench.say(f"{args.workers} workers, {args.mode} compute; output in {output}")
            if args.calibrate:
                calibrate(bench, list(workloads.values()), args.rate_list, points)
                return 0
            at_points = {
                point_key(name, rate): workloads[name].scaled(points[name][f"{rate:g}"]["device_tflops"])
                for name in args.profile_names for rate in args.rate_list
            }  # fmt: skip
            if args.job_steps:
                print(f"\nwhole wall time of a {args.job_steps}-step job (start-up, traces and re-plans included), "
                      f"median (min-max) of {args.repeats} runs:", flush=True)  # fmt: skip
                for key, workload in at_points.items():
                    job_wall_times(bench, workload, float(key.split("@")[1]), args.strategy_names, args.job_steps, args.repeats)
                return 0
            for key, workload in at_points.items():
                results[key] = measure(bench, workload, float(key.split("@")[1]), args.strategy_names, args.repeats)
                save_results(output / "results.json", results)
    except HarnessError as error:
        print(f"zoo_bench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: the table holds the points that finished (also in {output / 'results.json'})", flush=True)
    if results:
        print()
        print_table(results, workloads, args.strategy_names)
        print_summary(results, workloads, args.strategy_names)
        drawn = draw(lambda path: plot(results, args.strategy_names, path), output / "zoo.png")
        print(f"\n{drawn}; results: {output / 'results.json'}; logs in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
