"""One worker of the real-compute benchmark: an example model's real TensorFlow training step.

The model, optimizer, loss and synthetic batches are the example scripts' own
(examples/train_resnet50.py, examples/train_small.py), at the sizes of workloads.REAL_MODELS,
run on this machine's CPU with one intra-op thread per worker (the workers share the machine's
cores with each other and with Gloo). Every strategy trains through a public API:

    --strategy horovod       hvd.DistributedGradientTape in a tf.function called once per step,
                             as Horovod documents it and the examples' --horovod-baseline does
                             (HOROVOD_AUTOTUNE=1 in the environment makes it autotune)
    --strategy caramel       ctf.DistributedGradientTape in the same step, run through
                             ctf.function with --steps-per-execution steps per graph, as
                             TrainingRun.fit runs it
    --strategy compute-only  the Horovod strategy's loop with a plain tape: no communication
    --strategy comm-only     random tensors of the gradients' shapes allreduced at once with
                             Horovod's defaults, as emulated_worker.py's comm-only

Rank 0 prints a JSON line per measured step as it ends; every rank prints a JSON summary at the
end, as emulated_worker.py does. Run it through the benchmark driver
(`python -m benchmarks.scheduling_bench --compute real`), which starts it as a Caramel worker in
a network namespace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

# Before the examples are imported: their module-level tensors initialise TensorFlow's runtime.
tf.config.threading.set_intra_op_parallelism_threads(1)

import caramel.tensorflow as ctf  # noqa: E402
from benchmarks.loops import for_a_long_training, train_in_executions, train_per_step, training_step  # noqa: E402
from benchmarks.worker_events import StepLog, allreduce_all_at_once, caramel_details, print_summary  # noqa: E402
from benchmarks.workloads import REAL_MODELS, WORKER_STRATEGIES, RealModel, default_api, warmup_steps  # noqa: E402
from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION  # noqa: E402
from examples import train_resnet50, train_small  # noqa: E402

LEARNING_RATE = 0.01
RESNET50_IMAGE_SIZE = 32  # the smallest ResNet-50 takes: a step well under a second here
RESNET50_CLASSES = 100  # train_resnet50.py's default
SMALL_HIDDEN = 256  # train_small.py's default


@dataclass(frozen=True)
class Example:
    """An example model as its training script builds it."""

    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
    batch: Callable[[int, int], tuple[tf.Tensor, tf.Tensor]]
    """(step, rank) -> (inputs, labels)"""


def resnet50(spec: RealModel) -> Example:
    tf.keras.utils.set_random_seed(train_resnet50.SEED)
    size, classes = RESNET50_IMAGE_SIZE, RESNET50_CLASSES
    return Example(
        train_resnet50.build_model(size, classes),
        train_resnet50.build_optimizer(LEARNING_RATE),
        train_resnet50.LOSS,
        lambda step, rank: train_resnet50.batch(step, rank, spec.batch_size, size, classes),
    )


def small(spec: RealModel) -> Example:
    tf.keras.utils.set_random_seed(train_small.SEED)
    return Example(
        train_small.build_model(SMALL_HIDDEN),
        train_small.build_optimizer(LEARNING_RATE),
        train_small.LOSS,
        lambda step, rank: train_small.batch(step, rank, spec.batch_size),
    )


BUILDERS: dict[str, Callable[[RealModel], Example]] = {"resnet50": resnet50, "small": small}
assert BUILDERS.keys() == REAL_MODELS.keys(), "workloads.REAL_MODELS and BUILDERS name the same models"

TAPES = {
    "horovod": hvd.DistributedGradientTape,
    "caramel": ctf.DistributedGradientTape,
    "compute-only": lambda tape: tape,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(REAL_MODELS))
    parser.add_argument("--strategy", required=True, choices=WORKER_STRATEGIES)
    parser.add_argument(
        "--api", choices=("tape", "function"),
        help="tape: a tf.function called once per step; function: ctf.function, Caramel only (default: function for "
        "caramel, tape for the others)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
    parser.add_argument("--warmup", type=int, help="steps run before measuring (default: the benchmark's for --steps-per-execution)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=DEFAULT_STEPS_PER_EXECUTION,
        help=f"Caramel's steps per graph (default {DEFAULT_STEPS_PER_EXECUTION})",
    )  # fmt: skip
    parser.add_argument(
        "--whole-job", action="store_true",
        help="the run is a whole job of its steps (start-up and decisions included), not the steady state of a long training",
    )  # fmt: skip
    args = parser.parse_args()
    args.api = args.api or default_api("real", args.strategy)
    if args.api == "function" and args.strategy != "caramel":
        parser.error(f"--api function: Caramel's own API, not {args.strategy}'s")
    if args.warmup is None:
        args.warmup = warmup_steps(args.steps_per_execution)
    return args


def main() -> None:
    args = parse_args()
    if args.strategy == "caramel":
        ctf.init()  # joins Horovod's ranks and makes the communicator from the worker contract
        if not args.whole_job:
            for_a_long_training()
    else:
        hvd.init()
    spec = REAL_MODELS[args.model]
    example = BUILDERS[args.model](spec)
    variables = example.model.trainable_variables
    parameters = sum(variable.shape.num_elements() for variable in variables)
    if parameters != spec.parameters:
        sys.exit(f"{args.model} has {parameters} trainable parameters, workloads.REAL_MODELS says {spec.parameters}: update it")
    times = StepLog(args.warmup)
    total = args.warmup + args.steps
    details = {"model": args.model, "parameters": parameters, "batch_size": spec.batch_size}
    if args.strategy == "comm-only":
        gradients = [tf.random.stateless_uniform(v.shape, seed=[hvd.rank(), i]) for i, v in enumerate(variables)]
        allreduce_all_at_once(gradients, total, times)
    else:
        train_step = training_step(example.model, example.optimizer, example.loss, TAPES[args.strategy])
        if args.api == "function":
            data = tf.data.Dataset.range(total).map(lambda step: example.batch(step, hvd.rank()))
            train_in_executions(train_step, data, total, args.steps_per_execution, times)
        else:
            train_per_step(train_step, lambda step: example.batch(step, hvd.rank()), total, times)
    if args.strategy == "caramel":
        details.update(caramel_details())
    print_summary(args.strategy, times, details)


if __name__ == "__main__":
    main()
