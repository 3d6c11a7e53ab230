"""What a scheduling-benchmark run trains, in either compute mode, without importing TensorFlow.

    emulated  a profile of profiles.py (a model's tensors with its layers' times from FLOPs at a
              device rate, or a measured accelerator timeline: accelerator_timelines.py), its
              layer compute slept by emulated kernels (emulated_model.py, which runs them as
              KERNELS say) of a given rate (emulated_worker.py); the device rate can be scaled.
    real      an example model (examples/train_*.py) trained with real TensorFlow compute on
              this machine's CPU (real_worker.py); nothing can be scaled.

The driver (scheduling_bench.py) sees either as a Workload; real_worker.py builds the models of
REAL_MODELS and checks their parameter counts against this table, so the driver needs no
TensorFlow to know the gradient bytes.
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.accelerator_timelines import BASE_RATE, is_timeline, timeline_names
from benchmarks.profiles import BYTES_PER_PARAMETER, NAMES, Profile, load_profile, scaled
from caramel.planner.rounds import settled_step

EMULATED_WORKER = "benchmarks.emulated_worker"
GRAPH_OPS, DEVICE_CLOCK = "graph-ops", "device-clock"
KERNELS = (GRAPH_OPS, DEVICE_CLOCK)
"""How the emulated kernels run (emulated_model.py): ops of the step's graph that sleep where they
run, or ops that share one emulated device's clock."""
COMPUTED, WEIGHTS, UNSHAPED = "computed", "weights", "unshaped"
GRADIENTS = (COMPUTED, WEIGHTS, UNSHAPED)
"""How the emulated gradients are made (emulated_model.py): computed in the backward pass, the
weights' own values, or computed with no static shape."""
REAL_WORKER = "benchmarks.real_worker"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_script(name: str) -> dict[str, Any]:
    """The definitions of the example script examples/<name>.py (its model, optimizer, loss and
    batches), run from its file as `python examples/<name>.py` would run them, without its
    main(): the benchmarks train the examples' own models, and the examples stay scripts that
    nothing imports."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))


def warmup_steps(steps_per_execution: int) -> int:
    """Unmeasured steps of every run: until Caramel's steps run what its first rounds chose
    (`caramel.planner.rounds`). With 4 steps per execution Caramel runs steps 1-4 one at a time,
    adopts its first measured plan for step 5, whose first execution builds its graph, measures
    Horovod's way and the plan in blocks of 4 steps over steps 9-24, then its graph and Horovod's
    own graph of one step in blocks of 4 over steps 25-40, and from step 41 on runs the faster:
    40 steps. Later re-plans, if any, land in the measured steps, as they would in training."""
    return settled_step(steps_per_execution)


@dataclass(frozen=True)
class RealModel:
    """An example model at the size real_worker.py trains it."""

    name: str
    description: str
    batch_size: int
    parameters: int
    """Trainable parameters: real_worker.py refuses to run if the model it builds has others."""
    compute_seconds: float
    """A generous step compute time with 4 workers on 2 cores, for run timeouts only."""


REAL_MODELS = {
    model.name: model
    for model in (
        RealModel("resnet50", "ResNet-50 of examples/train_resnet50.py, 32x32 images, 100 classes", 16, 23_739_492, 2.0),
        RealModel("small", "the MLP of examples/train_small.py, hidden width 256", 64, 76_810, 0.1),
    )
}
# What a worker can run (its --strategy, and --api: which public API trains); the driver's
# strategies map onto them. horovod is plain Horovod (its tape: its Keras layer needs Keras 2),
# mwms TensorFlow's MultiWorkerMirroredStrategy (benchmarks/mwms.py), caramel Caramel on the
# backend its job's spec.caramel names, hvd-script plain Horovod's own loop unchanged, whose
# `import horovod.tensorflow` Caramel serves; comm-only averages every gradient at once with plain
# Horovod, comm-only-tf with MultiWorkerMirroredStrategy.
WORKER_STRATEGIES = ("horovod", "hvd-script", "mwms", "caramel", "compute-only", "comm-only", "comm-only-tf")
CARAMEL_WORKERS = ("caramel", "hvd-script")
"""The worker strategies that run on Caramel's runtime."""
FIT, FIT_AS_HOROVOD_COMPILES = "fit", "fit-plain"
"""Keras fit compiled with the run's steps_per_execution, and without (Horovod's examples' compile):
Caramel then chooses the steps per graph (caramel.tensorflow.fit_steps)."""


def compiled_steps_per_execution(api: str, steps_per_execution: int) -> int:
    """What a worker's Keras `compile` is given: the run's steps_per_execution for fit, none (1)
    for fit-plain, as Horovod's Keras examples compile."""
    return 1 if api == FIT_AS_HOROVOD_COMPILES else steps_per_execution

APIS = (FIT, FIT_AS_HOROVOD_COMPILES, "tape", "function")
WORKER_APIS = {
    "horovod": ("tape",),
    "hvd-script": ("tape",),
    "mwms": ("fit", "tape"),
    "caramel": (FIT, FIT_AS_HOROVOD_COMPILES, "tape", "function"),
    "compute-only": ("fit", "tape"),
    "comm-only": APIS,
    "comm-only-tf": APIS,
}
"""The APIs each worker strategy trains with (comm-only and comm-only-tf train nothing)."""


def default_api(compute: str, strategy: str) -> str:
    """The API a strategy trains with where the benchmark names none: Horovod's tape in a
    tf.function per step (Horovod's Keras fit needs Keras 2); otherwise Keras fit for emulated
    compute, and for real compute (whose models train by their examples' custom loops) a
    tf.function per step, or Caramel's ctf.function."""
    if strategy in ("horovod", "hvd-script"):
        return "tape"
    if compute == "emulated":
        return "fit"
    return "function" if strategy == "caramel" else "tape"
COMPUTE_MODES = {"emulated": NAMES + timeline_names(), "real": tuple(REAL_MODELS)}


def device_label(device_tflops: float | None, timeline: bool = False) -> str:
    """The emulated device, for people: its rate, or for a measured timeline how much slower than
    the accelerator measured it runs."""
    if device_tflops is None:
        return "real TF compute"
    return f"H200 x{BASE_RATE / device_tflops:.3g}" if timeline else f"{device_tflops:.3g} TFLOP/s"


@dataclass(frozen=True)
class Workload:
    """A model as the driver sees it: the worker that trains it and what to expect of a step."""

    name: str
    worker: str
    """The worker's module, run with `python -m` from the repository root."""
    worker_args: tuple[str, ...]
    """Which model (and device) the worker runs."""
    parameters: int
    batch_size: int
    compute_seconds: float
    """Expected compute per step, for timeouts (the runs measure the real C)."""
    description: str = ""
    profile: Profile | None = None
    """The emulated accelerator's profile; None for real compute, which cannot be device-scaled."""
    kernels: str | None = None
    """How the emulated kernels run (KERNELS); None for real compute."""
    gradients: str | None = None
    """How the emulated gradients are made (GRADIENTS); None for real compute."""

    @classmethod
    def emulated(cls, profile: Profile, worker: str = EMULATED_WORKER, kernels: str = GRAPH_OPS, gradients: str = COMPUTED) -> Workload:
        args = ("--profile", profile.name, "--device-tflops", repr(profile.device_tflops), "--kernels", kernels, "--gradients", gradients)
        return cls(profile.name, worker, args, profile.parameters, profile.batch_size, profile.compute_seconds, "", profile, kernels, gradients)

    @classmethod
    def real(cls, model: RealModel, worker: str = REAL_WORKER) -> Workload:
        return cls(model.name, worker, ("--model", model.name), model.parameters, model.batch_size, model.compute_seconds, model.description)

    @property
    def gradient_bytes(self) -> int:
        return self.parameters * BYTES_PER_PARAMETER

    @property
    def device_tflops(self) -> float | None:
        return self.profile.device_tflops if self.profile else None

    @property
    def scalable(self) -> bool:
        """Whether the device rate can be changed to balance compute and communication."""
        return self.profile is not None

    @property
    def timeline(self) -> bool:
        """Whether the profile replays a measured accelerator timeline."""
        return self.profile is not None and is_timeline(self.profile.name)

    @property
    def device(self) -> str:
        return device_label(self.device_tflops, self.timeline)

    @property
    def device_tag(self) -> str:
        """The device in a file name."""
        if self.profile is None:
            return "real"
        return f"x{BASE_RATE / self.profile.device_tflops:.3g}" if self.timeline else f"{self.device_tflops:.3g}tflops"

    def scaled(self, device_tflops: float) -> Workload:
        if self.profile is None:
            raise ValueError(f"{self.name}: real compute has no device rate to scale")
        return Workload.emulated(scaled(self.profile, device_tflops), self.worker, self.kernels or GRAPH_OPS, self.gradients or COMPUTED)

    def command(self, strategy: str, api: str, steps: int, warmup: int, steps_per_execution: int, whole_job: bool = False) -> list[str]:
        return [
            sys.executable, "-m", self.worker, *self.worker_args, "--strategy", strategy, "--api", api, "--steps", str(steps),
            "--warmup", str(warmup), "--steps-per-execution", str(steps_per_execution), *(["--whole-job"] if whole_job else []),
        ]  # fmt: skip


def make_workloads(
    compute: str,
    names: list[str],
    device_tflops: float | None = None,
    worker: str | None = None,
    kernels: str = GRAPH_OPS,
    gradients: str = COMPUTED,
) -> list[Workload]:
    """The workloads of names (COMPUTE_MODES[compute]); device_tflops overrides the profiles' (emulated only)."""
    if compute == "real":
        return [Workload.real(REAL_MODELS[name], worker or REAL_WORKER) for name in names]
    profiles = [load_profile(name) for name in names]
    if device_tflops:
        profiles = [scaled(profile, device_tflops) for profile in profiles]
    return [Workload.emulated(profile, worker or EMULATED_WORKER, kernels, gradients) for profile in profiles]
