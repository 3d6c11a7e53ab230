"""One worker of the emulated-accelerator benchmark: a Keras model whose layer compute is slept,
trained through one of the public APIs; the communication is real.

The model (emulated_model.py) has the profiled model's parameter tensors, grouped into layers
that take the profile's forward and backward times; its gradients are real tensors of the true
sizes, averaged over the shaped links with real Horovod/Gloo collectives.

    --strategy horovod       Horovod, as its documentation has it
    --strategy caramel       the same script with Caramel's drop-ins
    --strategy compute-only  the same training with a plain optimizer or tape: no communication
    --strategy comm-only     every gradient-sized tensor allreduced at once, Horovod's defaults

    --api fit       model.fit: hvd.DistributedOptimizer and BroadcastGlobalVariablesCallback, or
                    ctf.DistributedOptimizer and TrainingCallback; every strategy compiles with
                    the same --steps-per-execution (Keras runs them in a tf.while_loop, Caramel
                    as copies of one step in one graph)
    --api tape      a tf.function step called once per step with hvd.DistributedGradientTape or
                    ctf.DistributedGradientTape (Horovod's TF2 examples, import swapped)
    --api function  the tape step through ctf.function, --steps-per-execution steps per graph
                    (caramel only)

Rank 0 prints a JSON line per measured step; every rank prints a JSON summary at the end. Run it
through the benchmark driver (`python -m benchmarks.scheduling_bench`), which starts it as a
Caramel worker in a network namespace.
"""

from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks import emulated_model
from benchmarks.loops import for_a_long_training, train_in_executions, train_per_step, training_step
from benchmarks.profiles import load_profile, scaled
from benchmarks.workloads import APIS, WORKER_STRATEGIES, warmup_steps
from benchmarks.worker_events import StepLog, StepLogCallback, allreduce_all_at_once, caramel_details, print_summary
from caramel.tensorflow.keras import TrainingCallback
from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION

# Updates that leave the weights (and so the gradients) practically unchanged; they still cost
# what a real update costs.
LEARNING_RATE = 1e-9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="a profile of benchmarks/profiles")
    parser.add_argument("--strategy", required=True, choices=WORKER_STRATEGIES)
    parser.add_argument("--api", choices=APIS, default="fit", help="the public API that trains (default fit)")
    parser.add_argument("--steps", type=int, default=32, help="measured steps (default 32)")
    parser.add_argument("--warmup", type=int, help="steps run before measuring (default: the benchmark's for --steps-per-execution)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=DEFAULT_STEPS_PER_EXECUTION,
        help=f"Keras' steps_per_execution (default {DEFAULT_STEPS_PER_EXECUTION}, Caramel's)",
    )
    parser.add_argument("--device-tflops", type=float, help="emulated device rate; default: the profile's")
    parser.add_argument(
        "--whole-job", action="store_true",
        help="the run is a whole job of its steps (start-up and decisions included), not the steady state of a long training",
    )  # fmt: skip
    args = parser.parse_args()
    if args.api == "function" and args.strategy != "caramel":
        parser.error(f"--api function: Caramel's own API, not {args.strategy}'s")
    if args.warmup is None:
        args.warmup = warmup_steps(args.steps_per_execution)
    return args


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.strategy == "caramel":
        ctf.init()  # joins Horovod's ranks and makes the communicator from the worker contract
        if not args.whole_job:
            for_a_long_training()
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
    elif args.api == "fit":
        fit(model, args.strategy, total, args.steps_per_execution, times)
    else:
        loop(model, args.strategy, args.api, total, args.steps_per_execution, times)
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


def loop(model: tf.keras.Model, strategy: str, api: str, steps: int, steps_per_execution: int, times: StepLog) -> None:
    tape = {"horovod": hvd.DistributedGradientTape, "caramel": ctf.DistributedGradientTape}.get(strategy, lambda plain: plain)
    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(model.trainable_variables)
    broadcast = {"horovod": hvd.broadcast_variables, "caramel": ctf.broadcast_variables}.get(strategy)
    if broadcast:
        broadcast([*model.variables, *optimizer.variables], root_rank=0)
    train_step = training_step(model, optimizer, emulated_model.loss, tape)
    if api == "tape":
        inputs, labels = next(iter(emulated_model.dataset()))
        train_per_step(train_step, lambda step: (inputs, labels), steps, times)
    else:
        train_in_executions(train_step, emulated_model.dataset(), steps, steps_per_execution, times)


if __name__ == "__main__":
    main()
