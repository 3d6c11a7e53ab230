"""One worker of the emulated-accelerator benchmark: a Keras model whose layer compute is slept,
trained with `model.fit` through the public API; the communication is real.

The model (emulated_model.py) has one layer per parameter tensor of the profiled model, with
the profile's forward and backward times; its gradients are real tensors of the true sizes,
averaged over the shaped links with real Horovod/Gloo collectives.

    --strategy horovod       model.compile(optimizer=hvd.DistributedOptimizer(sgd)) and Horovod's
                             BroadcastGlobalVariablesCallback, as Horovod documents it (set
                             HOROVOD_AUTOTUNE=1 for autotune)
    --strategy caramel       model.compile(optimizer=ctf.DistributedOptimizer(sgd)) and Caramel's
                             TrainingCallback
    --strategy compute-only  the same fit with the plain optimizer: no communication
    --strategy comm-only     every gradient-sized tensor allreduced at once, Horovod's defaults

Every strategy compiles with the same --steps-per-execution. Rank 0 prints a JSON line per
measured step; every rank prints a JSON summary at the end. Run it through the benchmark driver
(`python -m benchmarks.scheduling_bench`), which starts it as a Caramel worker in a network
namespace.
"""

from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks import emulated_model
from benchmarks.profiles import load_profile, scaled
from benchmarks.workloads import WORKER_STRATEGIES, warmup_steps
from benchmarks.worker_events import StepLog, StepLogCallback, allreduce_all_at_once, caramel_details, print_summary
from caramel.tensorflow.keras import TrainingCallback
from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION

# Updates that leave the weights (and so the gradients) practically unchanged; they still cost
# what a real update costs.
LEARNING_RATE = 1e-9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="resnet50, vgg16 or bert_base")
    parser.add_argument("--strategy", required=True, choices=WORKER_STRATEGIES)
    parser.add_argument("--steps", type=int, default=32, help="measured steps (default 32)")
    parser.add_argument("--warmup", type=int, help="steps run before measuring (default: the benchmark's for --steps-per-execution)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=DEFAULT_STEPS_PER_EXECUTION,
        help=f"Keras' steps_per_execution (default {DEFAULT_STEPS_PER_EXECUTION}, Caramel's)",
    )
    parser.add_argument("--device-tflops", type=float, help="emulated device rate; default: the profile's")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = warmup_steps(args.steps_per_execution)
    return args


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.strategy == "caramel":
        ctf.init()  # joins Horovod's ranks and makes the communicator from the worker contract
    else:
        hvd.init()
    profile = load_profile(args.profile)
    if args.device_tflops:
        profile = scaled(profile, args.device_tflops)
    model = emulated_model.build_model(profile)
    times = StepLog(args.warmup)
    total = args.warmup + args.steps
    details: dict = {}
    if args.strategy == "comm-only":
        allreduce_all_at_once([variable.read_value() for variable in model.trainable_variables], total, times)
    else:
        fit(model, args.strategy, total, args.steps_per_execution, times)
        if args.strategy == "caramel":
            details = caramel_details()
    print_summary(args.strategy, times, details)


def fit(model: tf.keras.Model, strategy: str, steps: int, steps_per_execution: int, times: StepLog) -> None:
    sgd = tf.keras.optimizers.SGD(LEARNING_RATE)
    optimizer = {"horovod": hvd_keras.DistributedOptimizer, "caramel": ctf.DistributedOptimizer}.get(strategy, lambda o: o)(sgd)
    model.compile(optimizer=optimizer, loss=emulated_model.loss, steps_per_execution=steps_per_execution)
    callbacks: list[tf.keras.callbacks.Callback] = [StepLogCallback(times, steps_per_execution)]
    if strategy == "caramel":
        callbacks.append(TrainingCallback(model, steps_per_epoch=steps, epochs=1, batch_size=1))
    elif strategy == "horovod":
        callbacks.append(hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(emulated_model.dataset(), epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)


if __name__ == "__main__":
    main()
