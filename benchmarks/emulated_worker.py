"""One worker of the emulated-accelerator benchmark: layer compute is slept, communication is real.

Every parameter tensor of the profiled model is a layer whose forward and backward passes take
the profile's times (slept, so that compute does not fight the real Horovod/Gloo traffic for
the machine's two cores). Gradients are real tensors of the true sizes, averaged over the
shaped links with real Horovod collectives.

    --strategy horovod       Horovod as DistributedGradientTape drives it: each gradient enqueued
                             the moment it exists, Horovod fuses and orders them (set
                             HOROVOD_AUTOTUNE=1 for autotune), then a barrier before the next step.
    --strategy caramel       Caramel's TransferEngine: earliest-deadline-first schedule, batching
                             planned from the fitted link, and the next forward pass waiting for
                             each parameter only where it reads it.
    --strategy compute-only  the slept compute alone.
    --strategy comm-only     all gradients allreduced at once with Horovod's defaults.

Rank 0 prints a JSON line per measured step; every rank prints a JSON summary at the end.
Run it through the benchmark driver (benchmarks/scheduling_bench.py), which starts it as a
Caramel worker in a network namespace.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import wait
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from benchmarks.profiles import load_profile, scaled
from benchmarks.worker_events import HorovodReducers, StepLog, allreduce_all_at_once, engine_details, print_summary

from caramel.job.contract import WorkerContract  # noqa: E402
from caramel.tensorflow.engine import TransferEngine  # noqa: E402
from caramel.planner.transfers import Piece  # noqa: E402
from caramel.planner.schedule import TensorCost  # noqa: E402

STRATEGIES = ("horovod", "caramel", "compute-only", "comm-only")


class Device:
    """An emulated accelerator: a timeline of layer times, slept against deadlines.

    Like a real accelerator, whose kernels are queued ahead, the device does not wait for the
    host: a late wake-up of this Python thread (two cores, busy with Gloo) shortens the next
    sleep instead of adding up over hundreds of layers. Only a wait for a parameter idles it.
    """

    def __init__(self) -> None:
        self.free_at = time.perf_counter()

    def run(self, seconds: float) -> None:
        self.free_at += seconds
        delay = self.free_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def idle_until_now(self) -> None:
        """The device waited (for a parameter): its next work starts from now."""
        self.free_at = max(self.free_at, time.perf_counter())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="resnet50, vgg16 or bert_base")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="steps run before measuring (default 5)")
    parser.add_argument("--device-tflops", type=float, help="emulated device rate; default: the profile's")
    parser.add_argument("--apply-updates", action="store_true", help="apply SGD updates (costs CPU; off by default)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    profile = load_profile(args.profile)
    if args.device_tflops:
        profile = scaled(profile, args.device_tflops)
    layers = profile.tensors
    sizes = [int(tf.reduce_prod(layer.shape)) if layer.shape else 1 for layer in layers]
    gradients = [tf.random.stateless_uniform([size], seed=[hvd.rank(), index]) for index, size in enumerate(sizes)]
    weights = [tf.Variable(tf.zeros([size])) for size in sizes] if args.apply_updates else []
    times = StepLog(args.warmup)
    total = args.warmup + args.steps
    details: dict = {}
    if args.strategy == "compute-only":
        run_compute_only(layers, Device(), total, times)
    elif args.strategy == "comm-only":
        allreduce_all_at_once(gradients, total, times)
    elif args.strategy == "horovod":
        run_horovod(layers, gradients, weights, Device(), total, times)
    else:
        details = run_caramel(layers, gradients, weights, Device(), total, times)
    print_summary(args.strategy, details)


def run_compute_only(layers, device: Device, total: int, times: StepLog) -> None:
    for _ in range(total):
        started = time.perf_counter()
        for layer in layers:
            device.run(layer.forward_seconds)
        for layer in reversed(layers):
            device.run(layer.backward_seconds)
        times.append(time.perf_counter() - started)


def run_horovod(layers, gradients, weights, device: Device, total: int, times: StepLog) -> None:
    reducers = HorovodReducers(len(layers))
    with reducers.pool:
        for _ in range(total):
            started = time.perf_counter()
            for layer in layers:
                device.run(layer.forward_seconds)
            futures = []
            for index in reversed(range(len(layers))):
                device.run(layers[index].backward_seconds)
                futures.append(reducers.submit(index, gradients[index]))
            wait(futures)
            for future in futures:
                index, average = future.result()
                if weights:
                    weights[index].assign_sub(0.01 * average)
            device.idle_until_now()
            times.append(time.perf_counter() - started)


def run_caramel(layers, gradients, weights, device: Device, total: int, times: StepLog) -> dict:
    scheduling = WorkerContract.from_env().scheduling

    def apply_update(piece: Piece, average: tf.Tensor) -> None:
        if weights:
            weights[piece.tensor][piece.start : piece.stop].assign(
                weights[piece.tensor][piece.start : piece.stop] - 0.01 * average
            )

    costs = [
        TensorCost(int(g.shape[0]) * 4, 4, layer.forward_seconds, layer.backward_seconds)
        for g, layer in zip(gradients, layers)
    ]
    engine = TransferEngine(costs, scheduling, apply_update)
    exposed = 0.0
    try:
        for iteration in range(total):
            started = time.perf_counter()
            for index, layer in enumerate(layers):
                waiting = time.perf_counter()
                engine.wait_updated(iteration - 1, index)
                if time.perf_counter() - waiting > 1e-4:
                    device.idle_until_now()
                    exposed += time.perf_counter() - waiting
                device.run(layer.forward_seconds)
            for index in reversed(range(len(layers))):
                device.run(layers[index].backward_seconds)
                engine.gradient_ready(iteration, index, gradients[index])
            times.append(time.perf_counter() - started)
        engine.wait_all_updated(total - 1)
    finally:
        engine.close()
    return engine_details(engine, exposed)


if __name__ == "__main__":
    main()
