"""Caramel's gradient-communication scheduling against Horovod and TensorFlow's MultiWorkerMirroredStrategy, on emulated accelerators or real TF compute over shaped links.

    sudo make bench                                    # everything, with the defaults below
    python benchmarks/scheduling_bench.py --profiles resnet50 --rates 2000,4000 --repeats 1
    python benchmarks/scheduling_bench.py --compute real --profiles small,resnet50 --rates 1000,2000

Runs need root and the project's virtualenv. Each run starts --workers workers, each in its own
network namespace of an EmulatedCluster (benchmarks/netem.py: tbf-shaped full-duplex links of
the given rate; --cluster-prefix and --cluster-subnet keep a second cluster apart from one
already running), through Caramel's worker contract (benchmarks/jobrun.py). The compute is
either (--compute, see benchmarks/workloads.py):
    emulated   benchmarks/emulated_worker.py (the default): every parameter tensor of the profiled
               model (--profiles resnet50,vgg16,bert_base) is a layer whose compute is slept for
               its profiled time on an emulated accelerator of a given rate;
    real       benchmarks/real_worker.py: the example models (--profiles resnet50,small, from
               examples/train_resnet50.py at 32x32 images and examples/train_small.py) train with
               real TensorFlow compute, in a tf.function step with a tape drop-in, or by Keras fit,
               on this machine's CPU, which the workers share with the collectives.
Either way the gradients, of their true sizes, travel over the shaped links with real
collectives: Horovod's over Gloo, or TensorFlow's over gRPC.

For each profile (model) and each link rate of the sweep, the strategies (STRATEGIES; each runs
in worker processes of its own, through a library's public API) run one after another, the
repeats interleaved so that any drift of the machine hits all of them alike; by default:
    horovod-tape   plain Horovod's defaults (fusion 128 MiB, cycle 1 ms), hvd.DistributedGradientTape
                   in a tf.function called once per step, as its TF2 examples (plain_horovod.py)
    autotune-tape  the same with HOROVOD_AUTOTUNE=1, given --autotune-warmup unmeasured steps to
                   tune (Bayesian optimisation of fusion threshold and cycle time, see AUTOTUNE_ENV;
                   its log is kept and each run reports whether tuning finished before measuring)
    mwms-fit       TensorFlow's MultiWorkerMirroredStrategy, its own Keras fit with the same
                   steps_per_execution (mwms.py says what Keras 3 needs for it to run)
    caramel@hvd    Caramel's runtime on Horovod's collectives (spec.caramel.backend: horovod)
    caramel@tf     Caramel's runtime on TensorFlow's collectives (spec.caramel.backend: tensorflow)
and for the bounds, at every point, comm-only (every gradient allreduced at once by plain
Horovod, no compute: M, by which the operating points are chosen) and, where a strategy runs on
TensorFlow's collectives, comm-only-tf (the same by MultiWorkerMirroredStrategy: TensorFlow's M),
and once per profile and device rate, compute-only: the compute time C (no communication).
Horovod's own Keras fit (the `horovod` and `autotune` strategies before, hvd.DistributedOptimizer)
needs Keras 2, which TensorFlow 2.21 does not have: those names are refused, saying so.
A step time is the median over a run's measured steps; a cell is the median over --repeats
runs, shown with the min-max spread of the runs.

Lower bound on a step: max(C, M), M of the backend that moves the strategy's gradients. TicTac's
scheduling efficiency of a Caramel strategy's step T: E = (C + M - T) / (C + M - max(C, M)): 0
is no overlap at all, 1 is perfect overlap. Every strategy's step is set against each baseline
that ran (BASELINES: horovod-tape, mwms-fit). With emulated compute, each point also gets, per
backend's M, the tighter bounds of the layers' release and read order (step_bounds.py): one for
any schedule, one for a schedule whose step waits for its transfers (the baselines'), each
strategy's step over its own, and how long Caramel's transfers held the link inside its steps
against M.

The operating point, where scheduling matters most, is where compute and communication take
about equally long. It is found in one of three ways:
1. the rate sweep: the rate whose measured M is closest to C (in ratio) is the operating point
   if M/C lies within [1/OPERATING_POINT_TOLERANCE, OPERATING_POINT_TOLERANCE];
2. otherwise, with emulated compute, the device rate is scaled: no link this machine can
   emulate balances the profile (VGG-16 moves 553 MB of gradients per step: it needs far more
   than the fastest rate), so at the sweep's rate with the smallest measured M, the device is
   given --device-tflops = profile rate x C / M, so that C equals that M, and every strategy
   runs again there. Only the ratio of C to M matters for overlap (a device k times slower on
   the same link is that device on a link k times faster), except for fixed per-message costs,
   which this makes relatively smaller;
3. otherwise, with real compute, there is no device to scale: the rate whose M is closest to C
   is the operating point all the same, and the output says that it does not balance them.
The last lines, one per profile and Caramel strategy, give its speedup over every other strategy
and its distance from its bound there:
    PROFILE CARAMEL_STRATEGY speedup_vs_horovod-tape=R1 speedup_vs_autotune-tape=R2 speedup_vs_mwms-fit=R3 of_bound=R4

--rate-drop FROM:TO:AT_STEP runs Caramel only (the first Caramel strategy of --strategies): a fresh run at TO, then a run at FROM whose
links drop to TO live once rank 0 reports step AT_STEP; it prints the step times around the
drop and how many steps Caramel needed to come back within 10% of the fresh run at TO.

Everything goes to runs/bench-<time>/ (the workers' logs, Horovod's autotune logs, results.json,
step_time_vs_bandwidth.png). results.json is rewritten after every run, and Ctrl-C prints the
tables and draws the plot of the runs that finished; --report RESULTS_JSON prints them again
later, with this version's analysis. Every run has a timeout; whatever ends the benchmark (the end,
an error, Ctrl-C, SIGTERM), the namespaces, links, iptables rule and processes are removed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

from caramel.contract.api import MemoryAllocator
from testbed.lab import lab_variables

from benchmarks.jobrun import REPOSITORY, RunFailed, bench_job, hostnames, run_job
from benchmarks.netem import DEFAULT_PREFIX, DEFAULT_SUBNET, EmulatedCluster, HarnessError, Names
from benchmarks.plots import draw
from benchmarks.profiles import TUNED
from benchmarks.step_bounds import ordered_bounds
from benchmarks.accelerator_timelines import is_timeline
from benchmarks.workloads import CARAMEL_WORKERS, COMPUTE_MODES, GRAPH_OPS, KERNELS, Workload, default_api, device_label, make_workloads, warmup_steps

HOROVOD, TENSORFLOW = "horovod", "tensorflow"


JOB_NAME = "bench"
OPERATING_POINT_TOLERANCE = 1.25
CELL_WIDTH = 22  # "12.345 (12.000-13.000)"
RATIO_WIDTH = 22  # "caramel-function@hvd/H"
RECOVERY_TOLERANCE = 1.10  # rate drop: back within 10% of a fresh run
RECOVERY_STEPS_IN_A_ROW = 3
MiB = 1024 * 1024


@dataclass(frozen=True)
class Strategy:
    """What a benchmark strategy runs: the worker's strategy, the public API that trains
    (workloads.APIS), and Caramel's settings (the job's spec.caramel, through the public API, and
    the anchors' and ablations' planning policies, through the job's environment: testbed/lab.py)
    where the worker runs Caramel."""

    worker: str
    api: str | None = None
    """None: the compute mode's own (`workloads.default_api`)."""
    caramel: dict = field(default_factory=dict)
    description: str = ""
    backend: str = HOROVOD
    """Whose collectives move the gradients (HOROVOD or TENSORFLOW): the M of its bound."""
    lab: dict = field(default_factory=dict)
    """The lab settings (testbed/lab.py, `caramel.planner.policy.PlanningPolicy`'s fields) of an anchor or ablation."""


HVD, TF = {"backend": HOROVOD}, {"backend": TENSORFLOW}
"""spec.caramel for Caramel on each backend."""
STRATEGIES = {
    # The baselines, each a library's own public API, each in its own worker process:
    "horovod-tape": Strategy(
        "horovod", "tape", description="plain Horovod's defaults (fusion 128 MiB, cycle 1 ms), its tape in a tf.function called once "
        "per step (its TF2 examples)",
    ),  # fmt: skip
    "autotune-tape": Strategy("horovod", "tape", description="plain Horovod with HOROVOD_AUTOTUNE=1 (see AUTOTUNE_ENV), its tape in a tf.function per step"),
    "mwms-fit": Strategy(
        "mwms", "fit", description="TensorFlow's MultiWorkerMirroredStrategy, Keras fit with the same steps_per_execution "
        "(with the workarounds Keras 3 needs there: mwms.py)", backend=TENSORFLOW,
    ),  # fmt: skip
    "mwms-loop": Strategy(
        "mwms", "tape", description="TensorFlow's MultiWorkerMirroredStrategy, strategy.run in a tf.function called once per step "
        "(its custom-loop tutorial; no workaround)", backend=TENSORFLOW,
    ),  # fmt: skip
    # Caramel's public paths on each backend (spec.caramel.backend):
    "caramel@tf": Strategy("caramel", None, TF, "Caramel's default path (Keras fit emulated, TrainingRun.fit's ctf.function real) on TensorFlow's collectives", TENSORFLOW),
    "caramel-tape@tf": Strategy("caramel", "tape", TF, "Caramel's tape in a tf.function per step (Horovod's loop, import swapped), on TensorFlow's collectives", TENSORFLOW),
    "caramel-function@tf": Strategy("caramel", "function", TF, "Caramel's tape in the same step, through ctf.function, on TensorFlow's collectives", TENSORFLOW),
    "caramel@hvd": Strategy("caramel", None, HVD, "Caramel's default path (Keras fit emulated, TrainingRun.fit's ctf.function real) on Horovod's collectives"),
    "caramel-tape@hvd": Strategy("caramel", "tape", HVD, "Caramel's tape in a tf.function per step (Horovod's loop, import swapped), on Horovod's collectives"),
    "caramel-function@hvd": Strategy("caramel", "function", HVD, "Caramel's tape in the same step, through ctf.function, on Horovod's collectives"),
    # Caramel's defaults, spec.caramel.backend auto: Horovod's collectives where Horovod is installed
    # (as here). Runs recorded under these names between commit 1908d21 and the overlap issue ran
    # on TensorFlow's, which auto chose then for scripts that do not import Horovod's API
    # (benchmarks/README.md).
    "caramel": Strategy("caramel", None, {}, "Caramel's defaults (backend auto: horovod where installed)"),
    "caramel-tape": Strategy("caramel", "tape", {}, "Caramel's tape in a tf.function per step (backend auto: horovod where installed)"),
    "caramel-function": Strategy("caramel", "function", {}, "Caramel's tape through ctf.function (backend auto: horovod where installed)"),
    "caramel-fit-plain": Strategy(
        "caramel", "fit-plain", {}, "Keras fit compiled without steps_per_execution, as Horovod's examples compile it: Caramel "
        "chooses the steps per graph (backend auto: horovod where installed)",
    ),  # fmt: skip
    "hvd-script": Strategy(
        "hvd-script", "tape", {}, "horovod-tape's loop unchanged under Caramel: its `import horovod.tensorflow` is Caramel's (backend "
        "auto: horovod where installed)",
    ),  # fmt: skip
    # The anchors and ablations, each Caramel with lab settings (no part of the job's API), on
    # Horovod's collectives, as they were measured before (DeAR's split collectives exist on
    # Horovod's only):
    "bytescheduler": Strategy(
        "caramel", None, {**HVD, "minBucketBytes": 4 * MiB, "maxBucketBytes": 4 * MiB},
        "ByteScheduler's recipe in Caramel's graph: priority (next-forward) order, tensors cut into 4 MiB "
        "partitions, no merging, two transfers (8 MiB) in flight", lab={"batching": "fixed"},
    ),  # fmt: skip
    "dear": Strategy(
        "caramel", None, HVD,
        "DeAR's decoupling in Caramel's graph: each planned transfer reduce-scattered as soon as its gradients "
        "exist, all-gathered after the step's last reduce-scatter in the order the next forward pass needs them",
        lab={"collective": "split"},
    ),  # fmt: skip
    "caramel-arrival": Strategy(
        "caramel", None, HVD, "Caramel's graph and planned batching with Horovod's order: what the order alone is worth",
        lab={"ordering": "arrival"},
    ),  # fmt: skip
}
REMOVED = {
    "horovod": "Horovod's Keras fit (hvd.DistributedOptimizer and its callbacks) needs Keras 2, which TensorFlow 2.21 does not "
    "have: use horovod-tape",
    "autotune": "Horovod's Keras fit needs Keras 2: use autotune-tape",
}
"""Strategies that no longer run, and why."""
SWEEP_STRATEGIES = ("horovod-tape", "autotune-tape", "mwms-fit", "caramel@hvd", "caramel@tf")
BASELINES = ("horovod-tape", "mwms-fit")
"""What every Caramel strategy is set against, where they ran: each library's own way."""
COMM_ONLY = {HOROVOD: "comm-only", TENSORFLOW: "comm-only-tf"}
"""Each backend's M: every gradient averaged at once with no compute (plain Horovod's allreduce,
MultiWorkerMirroredStrategy's packed all-reduce)."""


def caramel_strategies(strategies: tuple[str, ...] | list[str]) -> list[str]:
    return [name for name in strategies if name in STRATEGIES and STRATEGIES[name].worker in CARAMEL_WORKERS]


def backend_of(strategy: str) -> str:
    """The backend whose M bounds the strategy (Horovod's for names this version does not know)."""
    return STRATEGIES[strategy].backend if strategy in STRATEGIES else HOROVOD


def comm_strategies(strategies: tuple[str, ...] | list[str]) -> list[str]:
    """The comm-only runs a point needs for these strategies: Horovod's always (the operating
    points were chosen by it), TensorFlow's where a strategy runs on it."""
    return [COMM_ONLY[HOROVOD], *([COMM_ONLY[TENSORFLOW]] if any(backend_of(name) == TENSORFLOW for name in strategies) else [])]


# A run's step time is the median over its measured executions (each step of one execution
# takes the execution's time over its steps): with at least three, one odd execution (the
# re-trace of an adopted plan, a stall) does not decide it.
MEASURED_EXECUTIONS = 3
# Horovod's autotuner scores a setting by the median of 5 samples of STEPS_PER_SAMPLE steps
# each, ignores its first WARMUP_SAMPLES settings, and tries MAX_SAMPLES + 1 settings of fusion
# threshold and cycle time (Bayesian optimisation) for every combination of its categorical
# knobs not fixed by the environment. With Horovod's defaults (3 warm-up, 10 steps, 20
# samples) and the two knobs a CPU build leaves free, that is some 5 x 10 x (3 + 4 x 21) =
# 4350 steps. Hierarchical allgather (no use with one slot per host, and allreduce is all that
# is measured) and the response cache (left on, Horovod's default) are therefore fixed, and
# tuning takes 5 x 1 x (1 + 11) = 60 steps, within the default --autotune-warmup of 65. Log
# level info makes Horovod log "Autotuner: Best params" when it is done.
AUTOTUNE_ENV = {
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "10",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "0",
    "HOROVOD_CACHE_CAPACITY": "1024",
    "HOROVOD_LOG_LEVEL": "info",
}
AUTOTUNE_DONE = "Autotuner: Best params"


@dataclass
class Run:
    """One run of one strategy: rank 0's step times and the largest peak RSS of any rank."""

    steps: list[float] = field(default_factory=list)
    peak_rss_bytes: int = 0
    rank_peak_rss_bytes: list[int] = field(default_factory=list)
    """Each rank's peak RSS: one outlier rank sets `peak_rss_bytes`, and the median of these shows a typical worker."""
    tensor_peak_bytes: int | None = None
    """The largest peak, over the ranks, of the bytes in use in TensorFlow's CPU allocator: live tensors only. Its pools
    are never returned, so RSS also counts their fragmentation, which varies from run to run and rank to rank. None
    where the allocator keeps no count."""
    cpu_seconds_per_step: float = math.nan
    """CPU time per measured step, mean over the ranks."""
    details: dict = field(default_factory=dict)
    error: str = ""
    wall_seconds: float = math.nan
    """The whole run, start-up included."""
    after_steps_seconds: float = math.nan
    """From the last step any worker reported to the run's end: the end of the training loops
    (their input pipelines' teardown), the summaries, the exit."""

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.steps) if self.steps else math.nan


@dataclass
class Cell:
    """The runs of one strategy at one rate and device rate."""

    runs: list[Run] = field(default_factory=list)

    def _values(self) -> list[float]:
        return [run.step_seconds for run in self.runs if run.steps]

    @property
    def median(self) -> float:
        return statistics.median(self._values()) if self._values() else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        values = self._values()
        return (min(values), max(values)) if values else (math.nan, math.nan)

    @property
    def peak_rss_bytes(self) -> int:
        return max((run.peak_rss_bytes for run in self.runs), default=0)

    @property
    def tensor_peak_bytes(self) -> int | None:
        return max((run.tensor_peak_bytes for run in self.runs if run.tensor_peak_bytes is not None), default=None)

    @property
    def median_rank_rss_bytes(self) -> float:
        """The median of every rank's peak RSS over the runs."""
        values = [value for run in self.runs for value in run.rank_peak_rss_bytes]
        return statistics.median(values) if values else math.nan

    @property
    def cpu_seconds_per_step(self) -> float:
        values = [run.cpu_seconds_per_step for run in self.runs if not math.isnan(run.cpu_seconds_per_step)]
        return statistics.median(values) if values else math.nan

    def detail_spread(self, key: str) -> tuple[float, float] | None:
        """The min and max over the runs of what the workers reported as `key`; None if none did."""
        values = [run.details[key] for run in self.runs if run.details.get(key) is not None]
        return (min(values), max(values)) if values else None

    def describe(self) -> str:
        low, high = self.spread
        if not self._values():
            return f"{'failed' if self.runs else 'not run':^{CELL_WIDTH}}"
        return f"{self.median:6.3f} ({low:.3f}-{high:.3f})".ljust(CELL_WIDTH)


@dataclass
class Point:
    """Every strategy at one link rate and device rate."""

    rate_mbit: float
    device_tflops: float | None  # None: real compute
    cells: dict[str, Cell] = field(default_factory=dict)
    measured: str = ""  # when and at which commit, so that a report joining runs in parts can say
    workers: int = 0
    """Ranks at the point (0: not recorded, as in results from before it was)."""
    cores: int = 0
    """CPU cores the ranks shared (0: not recorded)."""

    def median(self, strategy: str) -> float:
        return self.cells[strategy].median if strategy in self.cells else math.nan

    def comm(self, backend: str = HOROVOD) -> float:
        """The backend's M at this point."""
        return self.median(COMM_ONLY[backend])

    def backend_of(self, strategy: str) -> str:
        """The backend that moved the strategy's gradients here: what its Caramel runs reported, or
        the one it names; Horovod's for Caramel's runs under the names from before the backends
        (spec.caramel.backend auto) that reported none, which ran before there was another."""
        runs = self.cells.get(strategy, Cell()).runs
        reported = {run.details.get("backend") for run in runs} - {None}
        if len(reported) == 1:
            return cast(str, reported.pop())  # None taken out above
        auto = strategy in caramel_strategies([strategy]) and "backend" not in STRATEGIES[strategy].caramel
        return HOROVOD if auto and runs and not reported else backend_of(strategy)

    def bound_of(self, strategy: str) -> float:
        """max(C, M), M of the backend that moves the strategy's gradients."""
        return max(self.median("compute-only"), self.comm(self.backend_of(strategy)))

    @property
    def bound(self) -> float:
        """max(C, M) with Horovod's M, by which the operating points were chosen."""
        return max(self.median("compute-only"), self.comm(HOROVOD))

    def cpu_floor(self, *strategies: str) -> float:
        """The least step the cores allow a strategy, or a sum of strategies' work: every rank's
        CPU per step (the mean over ranks, times the ranks) over the cores. Process CPU time: the
        kernel's network work that softirq threads do is not in it, so the true floor is higher.
        NaN where the ranks or cores were not recorded."""
        if not (self.workers and self.cores):
            return math.nan
        return self.workers * sum(self.cells[name].cpu_seconds_per_step if name in self.cells else math.nan for name in strategies) / self.cores

    def efficiency(self, strategy: str) -> float:
        """TicTac's scheduling efficiency of the strategy's step, with its backend's M."""
        compute, comm, step = self.median("compute-only"), self.comm(self.backend_of(strategy)), self.median(strategy)
        overlap_possible = compute + comm - max(compute, comm)
        return (compute + comm - step) / overlap_possible if overlap_possible > 0 else math.nan

    def ratio(self, numerator: str, denominator: str) -> float:
        return self.median(numerator) / self.median(denominator)


class Bench:
    """Runs strategies of workloads on one emulated cluster, printing progress and keeping logs."""

    def __init__(self, args: argparse.Namespace, cluster: EmulatedCluster, output: Path) -> None:
        self.args = args
        self.cluster = cluster
        self.output = output
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        print(f"[{time.strftime('%H:%M:%S')} +{elapsed // 60}m{elapsed % 60:02d}s] {message}", flush=True)

    def run(
        self,
        workload: Workload,
        strategy: str,
        rate_mbit: float,
        repeat: int,
        steps: int | None = None,
        on_event: Callable[[dict], None] = lambda event: None,
        warmup: int | None = None,
        whole_job: bool = False,
    ) -> Run:
        """One run of strategy (a STRATEGIES name, compute-only or comm-only) at rate_mbit;
        `whole_job`: the run is a whole job, not the steady state of a long training."""
        self.cluster.set_rate(rate_mbit)
        steps = steps or self.args.steps
        tag = f"{workload.name}-{rate_mbit:g}mbit-{workload.device_tag}-{strategy}-{repeat}"
        warmup, env = self.args.warmup if warmup is None else warmup, dict(self.args.worker_env)
        if strategy.startswith("autotune") and warmup:
            warmup = self.args.autotune_warmup
            env |= {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(self.output / f"{tag}.autotune.csv"), **AUTOTUNE_ENV}
        chosen = STRATEGIES.get(strategy, Strategy(strategy))  # compute-only and comm-only run as they are named
        # A measured run stands for the steady state of a long training: its first plan's search,
        # which runs beside the steps in a job, is waited for, so that the warm-up ends where
        # `warmup_steps` says Caramel's first rounds do.
        lab = {**chosen.lab, **({"first_plan_waits": True} if chosen.worker in CARAMEL_WORKERS and not whole_job else {})}
        if lab:
            env |= lab_variables(**lab)
        api = chosen.api or default_api(self.args.compute, chosen.worker)
        command = workload.command(chosen.worker, api, steps, warmup, self.args.steps_per_execution, whole_job)
        job = bench_job(
            JOB_NAME, command, self.args.workers, self.cluster.interface, env, chosen.caramel, MemoryAllocator(self.args.memory_allocator)
        )
        self.say(f"{workload.name} at {rate_mbit:g} Mbit/s, {workload.device}: {strategy} (run {repeat + 1})")
        timeout = self.timeout(workload, rate_mbit, warmup + steps)
        try:
            result = run_job(self.cluster, job, timeout, self.output / f"{tag}.log", on_event)
        except RunFailed as failure:
            self.say(f"  FAILED ({failure}); log: {self.output / f'{tag}.log'}")
            return Run(error=str(failure))
        run = collect(result.events)
        run.wall_seconds = result.seconds
        run.after_steps_seconds = result.seconds - result.last_step_seconds
        note = ""
        if strategy.startswith("autotune"):
            run.details["autotune"] = read_autotune(self.output / f"{tag}.autotune.csv", self.output / f"{tag}.log")
            note = f"; autotune: {run.details['autotune']['samples']} settings scored, " + (
                "done" if run.details["autotune"]["done"] else "NOT done (raise --autotune-warmup)"
            )
        self.say(f"  {result.seconds:.0f} s ({run.after_steps_seconds:.1f} s of it after the last step), median step {run.step_seconds:.3f} s over {len(run.steps)} steps{note}")
        return run

    def timeout(self, workload: Workload, rate_mbit: float, steps: int) -> float:
        """Generous: start-up, plus ten times the slowest plausible step (compute plus a ring allreduce)."""
        workers = self.args.workers
        ring_bytes = 2 * (workers - 1) / workers * workload.gradient_bytes
        step = workload.compute_seconds + ring_bytes * 8 / (rate_mbit * 1e6)
        return self.args.run_timeout or 240 + 10 * steps * step


def collect(events: list[dict]) -> Run:
    steps = [event["seconds"] for event in events if event.get("event") == "step" and event.get("rank", 0) == 0]
    summaries = [event for event in events if event.get("event") == "summary"]
    rank0 = next((s for s in summaries if s.get("rank") == 0), {})
    details = {key: value for key, value in rank0.items() if key not in ("event", "rank", "peak_rss_bytes", "tensor_peak_bytes", "cpu_seconds_per_step")}
    cpu = [s["cpu_seconds_per_step"] for s in summaries if isinstance(s.get("cpu_seconds_per_step"), float)]
    return Run(
        steps=steps,
        peak_rss_bytes=max((s.get("peak_rss_bytes", 0) for s in summaries), default=0),
        rank_peak_rss_bytes=[s["peak_rss_bytes"] for s in summaries if "peak_rss_bytes" in s],
        tensor_peak_bytes=max((s["tensor_peak_bytes"] for s in summaries if s.get("tensor_peak_bytes") is not None), default=None),
        cpu_seconds_per_step=statistics.fmean(cpu) if cpu else math.nan,
        details=details,
    )


def read_autotune(csv_path: Path, log_path: Path) -> dict:
    """How far Horovod's autotuner got: settings scored, whether it finished, the last (best) setting."""
    rows = []
    if csv_path.is_file():
        with csv_path.open() as stream:
            rows = [[cell.strip() for cell in row] for row in csv.reader(stream) if row]
    return {
        "samples": max(0, len(rows) - 1),
        "done": AUTOTUNE_DONE in log_path.read_text(errors="replace"),
        "last": dict(zip(rows[0], rows[-1])) if len(rows) > 1 else {},
    }


# -- the sweep and the operating point --------------------------------------------------------


def measure_point(
    bench: Bench, workload: Workload, rate: float, strategies: tuple[str, ...], point: Point, measured: Callable[[], None]
) -> None:
    """Every strategy's runs at one point, repeats interleaved; `measured` is called after each run."""
    for repeat in range(bench.args.repeats):
        for strategy in strategies:
            run = bench.run(workload, strategy, rate, repeat)
            point.cells.setdefault(strategy, Cell()).runs.append(run)
            measured()


def compute_cell(bench: Bench, workload: Workload, rate: float) -> Cell:
    """Compute-only does not depend on the link: measured once per device rate."""
    cell = Cell()
    for repeat in range(bench.args.repeats):
        cell.runs.append(bench.run(workload, "compute-only", rate, repeat))
    return cell


def balanced(compute: float, comm: float) -> bool:
    """Whether compute and communication take about equally long (within OPERATING_POINT_TOLERANCE)."""
    return 1 / OPERATING_POINT_TOLERANCE <= comm / compute <= OPERATING_POINT_TOLERANCE


def choose_operating_point(
    compute: float, comm_by_rate: dict[float, float], scalable: bool = True
) -> tuple[float, float | None] | None:
    """(rate, device scale): scale None when the sweep itself balances compute and communication.

    Otherwise the scale multiplies the device rate so that compute equals the communication
    time at the rate where communication is fastest; a workload that cannot be scaled (real
    compute) gets the rate whose communication is closest to its compute, scale None. None if
    nothing was measured.
    """
    measured = {rate: comm for rate, comm in comm_by_rate.items() if not math.isnan(comm)}
    if not measured or math.isnan(compute):
        return None
    closest = min(measured, key=lambda rate: abs(math.log(measured[rate] / compute)))
    if balanced(compute, measured[closest]) or not scalable:
        return closest, None
    fastest = min(measured, key=measured.get)  # type: ignore[arg-type]  # .get of its own keys: never None
    return fastest, compute / measured[fastest]


Checkpoint = Callable[[list[Point], "Point | None"], None]
"""Told the points measured so far after every run (the last point may be partly measured),
and the operating point once it is chosen, so that an interrupted sweep keeps what it measured."""


def bench_workload(bench: Bench, workload: Workload, rates: list[float], checkpoint: Checkpoint) -> tuple[list[Point], Point | None]:
    """The sweep's points and the operating point (one of them, or a device-scaled extra one)."""
    compute = compute_cell(bench, workload, rates[0])
    points: list[Point] = []
    for rate in rates:
        point = Point(rate, workload.device_tflops, {"compute-only": compute})
        points.append(point)
        strategies = (*comm_strategies(bench.args.strategy_names), *bench.args.strategy_names)
        measure_point(bench, workload, rate, strategies, point, lambda: checkpoint(points, None))
    comm_by_rate = {p.rate_mbit: p.median("comm-only") for p in points}
    chosen = choose_operating_point(compute.median, comm_by_rate, workload.scalable)
    if chosen is None:
        bench.say(f"{workload.name}: no operating point: compute-only or comm-only failed at every rate")
        return points, None
    rate, scale = chosen
    at_rate = next(p for p in points if p.rate_mbit == rate)
    balance = f"C {compute.median:.3f} s, M {at_rate.median('comm-only'):.3f} s"
    if scale is None:
        if balanced(compute.median, comm_by_rate[rate]):
            bench.say(f"{workload.name}: operating point {rate:g} Mbit/s from the sweep ({balance})")
        else:
            bench.say(
                f"{workload.name}: no swept rate balances C and M within a factor {OPERATING_POINT_TOLERANCE:g} and "
                f"{workload.device} cannot be scaled; operating point {rate:g} Mbit/s, where M is closest to C ({balance})"
            )
        checkpoint(points, at_rate)
        return points, at_rate
    device = workload.scaled(cast(float, workload.device_tflops) * scale)  # scale is None unless the workload is scalable (emulated)
    bench.say(
        f"{workload.name}: no swept rate balances C {compute.median:.3f} s; operating point {rate:g} Mbit/s "
        f"(M {at_rate.median('comm-only'):.3f} s) with the device at {device.device}"
    )
    operating = Point(rate, device.device_tflops, {"compute-only": compute_cell(bench, device, rate)})
    for comm in comm_strategies(bench.args.strategy_names):
        operating.cells[comm] = at_rate.cells[comm]  # M does not depend on the device
    measure_point(bench, device, rate, bench.args.strategy_names, operating, lambda: checkpoint(points, operating))
    return points, operating


# -- reporting --------------------------------------------------------------------------------


def mebibytes(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:.0f}"


def print_table(
    workload: Workload, points: list[Point], operating: Point | None, strategies: tuple[str, ...], workers: int
) -> None:
    """Per rate: each strategy's step (median and spread of the runs), C, each backend's M, the
    bound with Horovod's M, and each strategy's step over each baseline's (BASELINES, where they
    ran); then per strategy its CPU, peak RSS and CPU floor (see `cpu_floor_seconds`), and per
    Caramel strategy TicTac's efficiency E and its step over its bound (with its backend's M)."""
    about = f" ({workload.description})" if workload.description else ""
    print(f"\n{workload.name}{about}: {workload.parameters / 1e6:.3g} M parameters, {workload.gradient_bytes / 1e6:.3g} MB "
          f"of gradients, batch {workload.batch_size}; step seconds, median (min-max) of the runs")  # fmt: skip
    rows = points + ([operating] if operating and operating not in points else [])
    comms = [name for name in COMM_ONLY.values() if name == "comm-only" or any(name in point.cells for point in rows)]
    baselines = [name for name in BASELINES if name in strategies]
    # Each strategy over each baseline, but a baseline over one set before it only (mwms-fit over
    # horovod-tape, not the inverse too).
    ratios = [(name, baseline) for i, baseline in enumerate(baselines) for name in strategies if name not in baselines[: i + 1]]
    legend = ", ".join(f"/{baseline[0].upper()} over {baseline}" for baseline in baselines)
    if legend:
        print(f"ratios: {legend}")
    header = (
        f"{'Mbit/s':>7} {'TFLOP/s':>7} | "
        + " | ".join(f"{name:^{CELL_WIDTH}}" for name in (*strategies, "compute", *comms))
        + f" | {'bound':>6} | "
        + " ".join(f"{name + '/' + baseline[0].upper():>{RATIO_WIDTH}}" for name, baseline in ratios)
    )
    print(header)
    print("-" * len(header))
    for point in rows:
        marker = " <- operating point" if point is operating else ""
        cell = lambda name: point.cells.get(name, Cell())  # noqa: E731
        print(
            f"{point.rate_mbit:7g} {device_column(point.device_tflops)} | "
            + " | ".join(cell(name).describe() for name in (*strategies, "compute-only", *comms))
            + f" | {point.bound:6.3f} | "
            + " ".join(f"{point.ratio(name, baseline):{RATIO_WIDTH}.3f}" for name, baseline in ratios)
            + marker
        )
    for point in rows:
        print(resources_line(point, strategies, workers))
        for name in caramel_strategies(strategies):
            line = f"  at {point.rate_mbit:g} Mbit/s: {name} E {point.efficiency(name):.2f}, {point.median(name) / point.bound_of(name):.2f}x its bound max(C, M {point.backend_of(name)})"
            for baseline in baselines:
                rss = cell_of(point, name).peak_rss_bytes / (cell_of(point, baseline).peak_rss_bytes or math.nan)
                cpu = cell_of(point, name).cpu_seconds_per_step / cell_of(point, baseline).cpu_seconds_per_step
                line += f"; over {baseline}: step {point.ratio(name, baseline):.3f}x, peak RSS {rss:.2f}x, CPU {cpu:.2f}x"
            print(line)
        for line in ordered_bounds_lines(workload, point, strategies):
            print(line)
        for name in [name for name in strategies if name.startswith("autotune")]:
            for run in cell_of(point, name).runs:
                tuned = run.details.get("autotune", {})
                if tuned:
                    where = f"  {name} at {point.rate_mbit:g} Mbit/s, {device_label(point.device_tflops, is_timeline(name))}: "
                    last, state = tuned["last"], "done, best" if tuned["done"] else "NOT done, last"
                    print(where + (
                        f"{tuned['samples']} settings scored, {state}: cycle {last['cycle_time_ms']} ms, "
                        f"fusion {last['tensor_fusion_threshold']} MB" if last else "no setting scored"
                    ))  # fmt: skip


def cell_of(point: Point, strategy: str) -> Cell:
    return point.cells.get(strategy, Cell())


def resources_line(point: Point, strategies: tuple[str, ...], workers: int) -> str:
    """Each strategy's CPU seconds per step and rank, peak RSS of the largest (and the median) rank,
    the largest rank's peak bytes in tensors, and its CPU floor."""
    ran = [name for name in strategies if name in point.cells]

    def each(describe: Callable[[Cell], str]) -> str:
        return ", ".join(f"{name} {describe(cell_of(point, name))}" for name in ran)

    return (
        f"  at {point.rate_mbit:g} Mbit/s: CPU seconds per step and rank: {each(lambda cell: f'{cell.cpu_seconds_per_step:.3f}')}; "
        f"peak RSS MiB, largest (median) rank: {each(lambda cell: f'{cell.peak_rss_bytes / 2**20:.0f} ({cell.median_rank_rss_bytes / 2**20:.0f})')}; "
        f"peak MiB in tensors, largest rank: {each(lambda cell: mebibytes(cell.tensor_peak_bytes))}; "
        f"CPU floor: {each(lambda cell: f'{cpu_floor_seconds(cell, workers):.3f} s')}"
    )


def print_tables(workloads: list[Workload], results: dict[str, tuple[list[Point], Point | None]], args: argparse.Namespace) -> None:
    """The table of every workload measured (in part, if interrupted)."""
    for workload in workloads:
        if workload.name in results:
            print_table(workload, *results[workload.name], args.strategy_names, args.workers)


def ordered_bounds_lines(workload: Workload, point: Point, strategies: tuple[str, ...]) -> list[str]:
    """Per backend whose M was measured here, what the layers' release and read order allow (see
    step_bounds.py) with that M, each strategy on that backend over the bound that applies to it,
    and how long each Caramel strategy's transfers held the link inside its steps against M; none
    without a profile (real compute)."""
    compute = point.median("compute-only")
    if workload.profile is None or math.isnan(compute):
        return []
    lines = []
    for backend, comm_name in COMM_ONLY.items():
        comm = point.median(comm_name)
        if math.isnan(comm):
            continue
        bounds = ordered_bounds(workload.profile, compute, comm)
        # Caramel's steps need not wait for their transfers; the baselines' (Horovod's tape,
        # autotuned or not, MultiWorkerMirroredStrategy's) do.
        mine = [name for name in strategies if name in point.cells and point.backend_of(name) == backend]
        ratios = [
            f"{name} {point.median(name) / bound:.2f}x {which}"
            for name in mine
            for bound, which in [(bounds.any_schedule, "the first") if name in caramel_strategies(strategies) else (bounds.step_barrier, "the second")]
        ]
        line = (
            f"  at {point.rate_mbit:g} Mbit/s, {device_label(point.device_tflops, workload.timeline)}, {backend}'s M: the release and read order allow steps of "
            f"{bounds.any_schedule:.3f} s to any schedule and {bounds.step_barrier:.3f} s to one whose step waits for its transfers "
            f"(the baselines')" + (f"; {', '.join(ratios)}" if ratios else "")
        )
        for name in caramel_strategies(mine):
            busy, exposed = cell_of(point, name).detail_spread("communication_seconds_per_step"), cell_of(point, name).detail_spread("exposed_seconds_per_step")
            if busy and exposed:
                line += (
                    f"; {name}'s transfers held the link {busy[0]:.3f}-{busy[1]:.3f} s a step (M {comm:.3f} s), "
                    f"its steps waited {exposed[0]:.3f}-{exposed[1]:.3f} s for them"
                )
        lines.append(line)
    return lines


def cpu_floor_seconds(cell: Cell, workers: int) -> float:
    """The shortest step the machine's cores allow for a strategy's CPU work: every rank's CPU
    seconds per step, over the cores they share. Where this exceeds max(C, M), the runs are
    bound by this machine's CPU, not by the link or the emulated device."""
    return workers * cell.cpu_seconds_per_step / (os.cpu_count() or 1)


def device_column(device_tflops: float | None) -> str:
    return f"{'real':>7}" if device_tflops is None else f"{device_tflops:7.3g}"


def summary_lines(name: str, operating: Point | None, strategies: tuple[str, ...]) -> list[str]:
    """Per Caramel strategy, at the operating point: every other non-Caramel strategy's step over
    its own (its speedup over each), and its step over its bound."""
    others = [other for other in strategies if other not in caramel_strategies(strategies)]
    lines = []
    for caramel in caramel_strategies(strategies):
        speedups = [f"speedup_vs_{other}={operating.ratio(other, caramel) if operating else math.nan:.3f}" for other in others]
        of_bound = operating.median(caramel) / operating.bound_of(caramel) if operating else math.nan
        lines.append(" ".join([name, caramel, *speedups, f"of_bound={of_bound:.3f}"]))
    return lines


def plot(results: dict[str, tuple[list[Point], Point | None]], strategies: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axis, (name, (points, _)) in zip(axes[0], results.items()):
        rates = [p.rate_mbit for p in points]
        measured = ("compute-only", *(name for name in COMM_ONLY.values() if any(name in p.cells for p in points)))
        for strategy in (*strategies, *measured):
            medians = [p.median(strategy) for p in points]
            spreads = [p.cells[strategy].spread if strategy in p.cells else (math.nan, math.nan) for p in points]
            errors = [[m - low for m, (low, _) in zip(medians, spreads)], [high - m for m, (_, high) in zip(medians, spreads)]]
            style = "--" if strategy in measured else "-"
            axis.errorbar(rates, medians, yerr=errors, fmt=f"o{style}", capsize=3, label=strategy)
        axis.plot(rates, [p.bound for p in points], ":", color="black", label="bound max(C, M), Horovod's M")
        axis.set(xscale="log", xlabel="link rate (Mbit/s)", ylabel="step time (s)", ylim=(0, None),
                 title=f"{name}, {device_label(points[0].device_tflops, is_timeline(name))}")  # fmt: skip
        axis.set_xticks(rates, [f"{r:g}" for r in rates])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def save_results(path: Path, results: dict[str, tuple[list[Point], Point | None]]) -> None:
    document = {
        name: {"sweep": [asdict(point) for point in points], "operating_point": asdict(operating) if operating else None}
        for name, (points, operating) in results.items()
    }
    path.write_text(json.dumps(document, indent=1, default=str))


def load_results(path: Path) -> dict[str, tuple[list[Point], Point | None]]:
    """What `save_results` wrote. An operating point that is one of the sweep's points is that point."""

    def point(document: dict) -> Point:
        cells = {name: Cell([Run(**run) for run in cell["runs"]]) for name, cell in document["cells"].items()}
        return Point(document["rate_mbit"], document["device_tflops"], cells)

    results = {}
    for name, document in json.loads(path.read_text()).items():
        points = [point(sweep_point) for sweep_point in document["sweep"]]
        operating = point(document["operating_point"]) if document["operating_point"] else None
        results[name] = (points, next((p for p in points if p == operating), operating))
    return results


def strategies_run(results: dict[str, tuple[list[Point], Point | None]]) -> tuple[str, ...]:
    """The strategies an earlier run measured, in the order it ran them (compute-only and the
    comm-only runs left out)."""
    names = [name for points, operating in results.values() for point in [*points, *([operating] if operating else [])] for name in point.cells]
    return tuple(dict.fromkeys(name for name in names if name != "compute-only" and name not in COMM_ONLY.values()))


def report(args: argparse.Namespace) -> int:
    """The tables and summary lines of an earlier run, from its results.json, as this version prints them."""
    try:
        results = load_results(args.report)
        workloads = make_workloads(args.compute, list(results))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"scheduling_bench: --report {args.report}: cannot be read as a results.json of --compute {args.compute}: {error}", file=sys.stderr)
        return 2
    if not args.strategies_given:
        args.strategy_names = strategies_run(results)
    print_tables(workloads, results, args)
    print()
    for workload in workloads:
        for line in summary_lines(workload.name, results[workload.name][1], args.strategy_names):
            print(line)
    return 0


# -- the rate drop ----------------------------------------------------------------------------


def rate_drop(bench: Bench, workload: Workload, drop: tuple[float, float, int]) -> None:
    drop_from, drop_to, at_step = drop
    steps = at_step + bench.args.steps_after_drop
    caramel = next(iter(caramel_strategies(bench.args.strategy_names)), "caramel")  # the first of --strategies
    fresh = bench.run(workload, caramel, drop_to, 0, steps=bench.args.steps)
    arrivals: dict[int, float] = {}  # step -> when its line reached us

    def watch(event: dict) -> None:
        if event.get("event") != "step":
            return
        arrivals[event["step"]] = time.monotonic()
        if event["step"] == at_step:
            bench.cluster.set_rate(drop_to)
            bench.say(f"  step {at_step} done: links now {drop_to:g} Mbit/s")

    run = bench.run(workload, caramel, drop_from, 0, steps=steps, on_event=watch)
    # Valid only if the steps after the drop were reported as they ran, not all at the end.
    after_drop = sum(run.steps[at_step:])
    if at_step not in arrivals or max(arrivals.values()) - arrivals[at_step] < after_drop / 2:
        print(f"\n{workload.name}: no valid rate drop: rank 0 did not report step {at_step} while the later steps "
              "ran (the worker must print each step line as the step ends)")  # fmt: skip
        return
    reference = fresh.step_seconds
    print(f"\n{workload.name}: {caramel}, links {drop_from:g} -> {drop_to:g} Mbit/s after step {at_step}; "
          f"a fresh run at {drop_to:g} Mbit/s: median step {reference:.3f} s")  # fmt: skip
    for step, seconds in enumerate(run.steps, start=1):
        if step >= at_step - 3:
            print(f"  step {step:4d}  {seconds:7.3f} s  {seconds / reference:5.2f} x fresh{'   <- rate drop' if step == at_step else ''}")
    recovered = steps_to_recover(run.steps[at_step:], reference)
    if recovered is None:
        print(f"{workload.name} rate drop: never back within 10% of a fresh run")
    else:
        print(f"{workload.name} rate drop: within 10% of a fresh run from step {at_step + recovered + 1} on "
              f"({recovered} slower step(s) after the drop)")  # fmt: skip


def steps_to_recover(after_drop: list[float], reference: float) -> int | None:
    """Steps after the drop until RECOVERY_STEPS_IN_A_ROW consecutive steps are within 10% of reference."""
    for start in range(len(after_drop) - RECOVERY_STEPS_IN_A_ROW + 1):
        if all(s <= RECOVERY_TOLERANCE * reference for s in after_drop[start : start + RECOVERY_STEPS_IN_A_ROW]):
            return start
    return None


def parse_rate_drop(spec: str) -> tuple[float, float, int]:
    drop_from, drop_to, at_step = spec.split(":")
    return float(drop_from), float(drop_to), int(at_step)


# -- main -------------------------------------------------------------------------------------


def parse_worker_env(setting: str) -> tuple[str, str]:
    name, equals, value = setting.partition("=")
    if not equals or not name.isidentifier():
        raise ValueError(f"expected NAME=VALUE such as TF_ENABLE_ONEDNN_OPTS=0, got {setting!r}")
    return name, value


def parse_strategies(parser: argparse.ArgumentParser, strategies: str, report: bool = False) -> tuple[str, ...]:
    """--strategies: comma-separated names of STRATEGIES; a removed one is refused with the reason,
    except in a --report of a run that had it."""
    names = tuple(dict.fromkeys(name.strip() for name in strategies.split(",") if name.strip()))
    removed = [name for name in names if name in REMOVED and not report]
    if removed:
        parser.error("--strategies: " + "; ".join(f"{name} no longer runs: {REMOVED[name]}" for name in removed))
    unknown = [name for name in names if name not in STRATEGIES and name not in REMOVED]
    if unknown or not names:
        parser.error(f"--strategies: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(STRATEGIES)})")
    return names


def parse_rates(parser: argparse.ArgumentParser, rates: str) -> list[float]:
    """--rates: comma-separated link rates in Mbit/s, sorted."""
    try:
        rate_list = sorted(float(rate) for rate in rates.split(","))
    except ValueError:
        parser.error(f"--rates: expected comma-separated Mbit/s such as 1000,4000, got {rates!r}")
    if any(rate <= 0 for rate in rate_list):
        parser.error(f"--rates: rates must be positive, got {rates!r}")
    return rate_list


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the method.")
    parser.add_argument(
        "--compute", choices=tuple(COMPUTE_MODES), default="emulated",
        help="emulated: profiles' layer compute slept on an emulated accelerator (default); real: the example "
        "models' real TensorFlow compute on this machine's CPU",
    )  # fmt: skip
    parser.add_argument(
        "--profiles",
        help=f"comma-separated: emulated profiles ({', '.join(COMPUTE_MODES['emulated'])}) or, with --compute real, "
        f"example models ({', '.join(COMPUTE_MODES['real'])}); default: {','.join(TUNED)} (emulated; benchmarks/zoo_bench.py "
        "runs the zoo), all of real's",
    )
    parser.add_argument("--rates", default="1000,2000,4000,8000", help="link rates in Mbit/s (default 1000,2000,4000,8000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per strategy and rate (default 3)")
    parser.add_argument("--steps", type=int, default=24, help="measured steps per run (default 24)")
    parser.add_argument(
        "--warmup", type=int,
        help="unmeasured steps first (default: until Caramel runs what its first rounds chose, Horovod's way or its plan and "
        "then its graph or Horovod's own, 40 steps at 4 steps per execution; no fewer where a Caramel strategy runs)",
    )  # fmt: skip
    parser.add_argument(
        "--steps-per-execution", type=int, default=4,
        help="steps per graph execution, for every strategy: Keras' steps_per_execution (emulated), Caramel's "
        "ctf.function (real) (default 4)",
    )  # fmt: skip
    parser.add_argument(
        "--autotune-warmup", type=int, default=65,
        help="unmeasured steps of the autotune runs, for Horovod to tune in: 60 with the autotune "
        "settings used here (AUTOTUNE_ENV); each run reports whether tuning finished (default 65)",
    )  # fmt: skip
    parser.add_argument(
        "--strategies",
        help=f"comma-separated strategies to compare, from {', '.join(STRATEGIES)} (default {','.join(SWEEP_STRATEGIES)}; "
        "with --report, the run's own); compute-only and comm-only always run, for the bound, and comm-only-tf where a "
        "strategy runs on TensorFlow's collectives",
    )  # fmt: skip
    parser.add_argument("--device-tflops", type=float, help="emulated device rate (default: each profile's; --compute emulated only)")
    parser.add_argument(
        "--kernels", choices=KERNELS, default=GRAPH_OPS,
        help=f"how the emulated compute runs (emulated_model.py): ops of the step's graph that sleep where they run, or on one "
        f"emulated device's clock (default {GRAPH_OPS})",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--run-timeout", type=float, help="seconds per run (default: from the expected step time)")
    parser.add_argument(
        "--rate-drop", metavar="FROM:TO:AT_STEP",
        help="run the rate-drop experiment instead of the sweep, with the first Caramel strategy of --strategies",
    )  # fmt: skip
    parser.add_argument(
        "--steps-after-drop", type=int, default=60,
        help="rate drop: measured steps after the drop (default 60; Caramel re-plans early and then every replanIntervalSteps (20 by default))",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-prefix", default=DEFAULT_PREFIX,
        help=f"name prefix of the namespaces, links and bridge (default {DEFAULT_PREFIX}); another cluster running at the same time needs its own",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-subnet", default=DEFAULT_SUBNET,
        help=f"the cluster's private /24 (default {DEFAULT_SUBNET}); another cluster running at the same time needs its own, such as 10.213.8.0/24",
    )  # fmt: skip
    parser.add_argument(
        "--worker-env", metavar="NAME=VALUE", action="append", default=[],
        help="an environment variable for every worker of every strategy (the job's spec.env), such as an allocator "
        "setting to compare under the same conditions; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--memory-allocator", choices=[choice.value for choice in MemoryAllocator], default=MemoryAllocator.TCMALLOC.value,
        help="every strategy's spec.workers.memoryAllocator (default tcmalloc, as in a job; tensorflow: oneDNN's own pool)",
    )  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a worker module; default: the compute mode's worker
    parser.add_argument("--output", type=Path, help="directory for logs and results (default runs/bench-<time>)")
    parser.add_argument(
        "--report", type=Path, metavar="RESULTS_JSON",
        help="print the tables and summary lines of an earlier run from its results.json, with this version's analysis, "
        "and run nothing (give the run's --compute and --strategies)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    known = COMPUTE_MODES[args.compute]
    default = TUNED if args.compute == "emulated" else known
    args.profile_names = [name.strip() for name in args.profiles.split(",") if name.strip()] if args.profiles else list(default)
    unknown = [name for name in args.profile_names if name not in known]
    if unknown or not args.profile_names:
        parser.error(
            f"--profiles: unknown {', '.join(unknown) or '(none given)'} for --compute {args.compute} (known: {', '.join(known)})"
        )
    if args.device_tflops and args.compute != "emulated":
        parser.error("--device-tflops: only with --compute emulated (real compute runs at this machine's rate)")
    try:
        Names(args.cluster_prefix)
    except HarnessError as error:
        parser.error(f"--cluster-prefix: {error}")
    args.strategies_given = args.strategies is not None
    args.strategy_names = parse_strategies(parser, args.strategies, args.report is not None) if args.strategies_given else SWEEP_STRATEGIES
    if args.steps_per_execution < 1:
        parser.error(f"--steps-per-execution: must be at least 1, got {args.steps_per_execution}")
    if args.steps < MEASURED_EXECUTIONS * args.steps_per_execution:
        parser.error(
            f"--steps: {args.steps} steps are fewer than {MEASURED_EXECUTIONS} executions of --steps-per-execution "
            f"{args.steps_per_execution}; a run's median step would then be decided by one execution, such as one that re-traces"
        )
    settled = warmup_steps(args.steps_per_execution)
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup: must be 0 or more steps, got {args.warmup}")
    if args.warmup is None:
        args.warmup = settled
    elif args.warmup < settled and (args.rate_drop or caramel_strategies(args.strategy_names)):
        parser.error(
            f"--warmup: {args.warmup} steps end before Caramel's first rounds chose the backend's own way or its plan, and its graph or the "
            f"backend's own, at {args.steps_per_execution} steps per execution (by step {settled}); use at least {settled}"
        )
    args.rate_list = parse_rates(parser, args.rates)
    try:
        args.worker_env = [parse_worker_env(setting) for setting in args.worker_env]
    except ValueError as error:
        parser.error(f"--worker-env: {error}")
    try:
        args.drop = parse_rate_drop(args.rate_drop) if args.rate_drop else None
    except ValueError:
        parser.error(f"--rate-drop: expected FROM:TO:AT_STEP such as 4000:1000:20, got {args.rate_drop!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report(args)
    if os.geteuid() != 0:
        print("scheduling_bench needs root: it builds network namespaces, veths, a bridge, tc shaping and an iptables rule", file=sys.stderr)
        return 2
    output = args.output or REPOSITORY / "runs" / time.strftime("bench-%Y%m%d-%H%M%S")
    output.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.1f}: other processes compete for the CPU that Gloo and the workers need", flush=True)
    workloads = make_workloads(args.compute, args.profile_names, args.device_tflops, args.worker, args.kernels)
    results: dict[str, tuple[list[Point], Point | None]] = {}
    names = hostnames(bench_job(JOB_NAME, ["true"], args.workers, None))  # depend on the job's name and size only
    try:
        with EmulatedCluster(args.workers, args.rate_list[0], args.cluster_prefix, args.cluster_subnet, names) as cluster:
            bench = Bench(args, cluster, output)
            bench.say(f"{args.workers} workers, {args.compute} compute; output in {output}")
            if args.drop:
                for workload in workloads:
                    rate_drop(bench, workload, args.drop)
                return 0
            for workload in workloads:

                def checkpoint(points: list[Point], operating: Point | None, name: str = workload.name) -> None:
                    results[name] = (points, operating)
                    save_results(output / "results.json", results)

                bench_workload(bench, workload, args.rate_list, checkpoint)
    except HarnessError as error:
        print(f"scheduling_bench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: the tables and plot hold the runs that finished (also in {output / 'results.json'})", flush=True)
        print_tables(workloads, results, args)
        if results:
            print(draw(lambda path: plot(results, args.strategy_names, path), output / "step_time_vs_bandwidth.png"))
        return 130
    print_tables(workloads, results, args)
    drawn = draw(lambda path: plot(results, args.strategy_names, path), output / "step_time_vs_bandwidth.png")
    print(f"\n{drawn}; results: {output / 'results.json'}; logs in {output}\n")
    for workload in workloads:
        for line in summary_lines(workload.name, results[workload.name][1], args.strategy_names):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
