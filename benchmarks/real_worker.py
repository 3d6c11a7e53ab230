"""One worker of the real-compute benchmark: an example model's real TensorFlow training step.

The model, optimizer, loss and synthetic batches are the example scripts' own
(examples/train_resnet50.py, examples/train_small.py), at the sizes of workloads.REAL_MODELS,
run on this machine's CPU with one intra-op thread per worker (the workers share the machine's
cores with each other and with the collectives). Every strategy trains through a public API:

    --strategy horovod       plain Horovod's hvd.DistributedGradientTape in a tf.function called
                             once per step, as Horovod documents it (Caramel's horovod package
                             bypassed: plain_horovod.py; HOROVOD_AUTOTUNE=1 in the environment
                             makes it autotune)
    --strategy mwms          TensorFlow's MultiWorkerMirroredStrategy (mwms.py): its custom loop,
                             strategy.run in a tf.function per step (--api tape), or Keras fit
                             with the model and optimizer made in its scope (--api fit)
    --strategy caramel       ctf.DistributedGradientTape in the same step, run through
                             ctf.function with --steps-per-execution steps per graph, as
                             TrainingRun.fit runs it (--api function), or called once per step
                             (--api tape), or Keras fit with ctf.DistributedOptimizer and
                             TrainingCallback (--api fit); on the backend spec.caramel.backend names
    --strategy compute-only  the Horovod strategy's loop with a plain tape: no communication
    --strategy comm-only     random tensors of the gradients' shapes allreduced at once with
                             plain Horovod's defaults, as emulated_worker.py's comm-only
    --strategy comm-only-tf  the same tensors averaged at once by MultiWorkerMirroredStrategy

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
from types import ModuleType
from typing import cast

import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks import mwms
from benchmarks.joining import join
from benchmarks.loops import train_in_executions, train_per_step, training_step
from benchmarks.plain_horovod import variables_of
from benchmarks.worker_args import add_run_arguments, parse_run_arguments
from benchmarks.worker_events import StepLog, StepLogCallback, allreduce_all_at_once, allreduce_all_at_once_tf, caramel_details, print_summary, rank
from benchmarks.workloads import (
    APIS,
    FIT,
    FIT_AS_HOROVOD_COMPILES,
    REAL_MODELS,
    WORKER_APIS,
    WORKER_STRATEGIES,
    RealModel,
    compiled_steps_per_execution,
    example_script,
)
from caramel.tensorflow.keras import TrainingCallback

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


# The examples' definitions are run where a model is built, once the worker has joined its ranks:
# their module-level tensors initialise TensorFlow's runtime, after which
# MultiWorkerMirroredStrategy can no longer set up its collectives.


def resnet50(spec: RealModel) -> Example:
    example = example_script("train_resnet50")
    tf.keras.utils.set_random_seed(example["SEED"])
    size, classes = RESNET50_IMAGE_SIZE, RESNET50_CLASSES
    return Example(
        example["build_model"](size, classes),
        example["build_optimizer"](LEARNING_RATE),
        example["LOSS"],
        lambda step, rank: example["batch"](step, rank, spec.batch_size, size, classes),
    )


def small(spec: RealModel) -> Example:
    example = example_script("train_small")
    tf.keras.utils.set_random_seed(example["SEED"])
    return Example(
        example["build_model"](SMALL_HIDDEN),
        example["build_optimizer"](LEARNING_RATE),
        example["LOSS"],
        lambda step, rank: example["batch"](step, rank, spec.batch_size),
    )


BUILDERS: dict[str, Callable[[RealModel], Example]] = {"resnet50": resnet50, "small": small}
assert BUILDERS.keys() == REAL_MODELS.keys(), "workloads.REAL_MODELS and BUILDERS name the same models"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(REAL_MODELS))
    parser.add_argument("--strategy", required=True, choices=WORKER_STRATEGIES)
    parser.add_argument(
        "--api", choices=APIS,
        help="tape: a tf.function called once per step; function: ctf.function, Caramel only; fit: Keras fit, mwms and "
        "caramel only; fit-plain: fit compiled without steps_per_execution, Caramel only (default: function for caramel, "
        "tape for the others)",
    )  # fmt: skip
    add_run_arguments(parser, measured_steps=30)
    apis = {strategy: [api for api in WORKER_APIS[strategy] if strategy != "compute-only" or api != FIT] for strategy in WORKER_STRATEGIES}
    return parse_run_arguments(parser, "real", apis)


def main() -> None:
    args = parse_args()
    joined = join(args.strategy, args.whole_job)
    hvd, strategy = joined.hvd, joined.mwms_strategy
    spec = REAL_MODELS[args.model]
    with joined.scope():
        example = BUILDERS[args.model](spec)
    variables = example.model.trainable_variables
    parameters = sum(variable.shape.num_elements() for variable in variables)
    if parameters != spec.parameters:
        sys.exit(f"{args.model} has {parameters} trainable parameters, workloads.REAL_MODELS says {spec.parameters}: update it")
    times = StepLog(args.warmup, f"{args.strategy}-{args.api}")
    total = args.warmup + args.steps
    details = {"model": args.model, "parameters": parameters, "batch_size": spec.batch_size}
    me = rank()
    if args.strategy in ("comm-only", "comm-only-tf"):
        gradients = [tf.random.stateless_uniform(v.shape, seed=[me, i]) for i, v in enumerate(variables)]
        if hvd is not None:
            allreduce_all_at_once(hvd, gradients, total, times)
        else:
            allreduce_all_at_once_tf(strategy, gradients, total, times)
    elif args.api in (FIT, FIT_AS_HOROVOD_COMPILES):
        fit(example, args.strategy, total, compiled_steps_per_execution(args.api, args.steps_per_execution), times, me, strategy)
    elif args.strategy == "mwms":
        with cast(tf.distribute.Strategy, strategy).scope():  # joined with MWMS
            example.optimizer.build(variables)
        step = mwms.loop_step(strategy, example.model, example.optimizer, example.loss)
        train_per_step(step, lambda step: example.batch(step, me), total, times)
    else:
        train_step = training_step(example.model, example.optimizer, example.loss, *distributed_tape(args.strategy, example, hvd))
        if args.api == "function":
            data = tf.data.Dataset.range(total).map(lambda step: example.batch(step, me))
            train_in_executions(train_step, data, total, args.steps_per_execution, times)
        else:
            train_per_step(train_step, lambda step: example.batch(step, me), total, times)
    if args.strategy == "caramel":
        details.update(caramel_details())
    print_summary(args.strategy, times, details)


def distributed_tape(strategy: str, example: Example, hvd: ModuleType | None) -> tuple[Callable, Callable]:
    """The strategy's tape drop-in and the sources it differentiates against, the model and
    optimizer broadcast from rank 0 first, as each library's examples do."""
    example.optimizer.build(example.model.trainable_variables)
    variables = [*example.model.variables, *example.optimizer.variables]
    if strategy == "horovod":
        hvd = cast(ModuleType, hvd)  # joined with Horovod
        hvd.broadcast_variables(variables_of(variables), root_rank=0)
        return hvd.DistributedGradientTape, variables_of
    if strategy == "caramel":
        ctf.broadcast_variables(variables, root_rank=0)
        return ctf.DistributedGradientTape, list
    return (lambda tape: tape), list


def fit(
    example: Example, strategy: str, steps: int, steps_per_execution: int, times: StepLog, me: int, mwms_strategy: tf.distribute.Strategy | None
) -> None:
    """Keras fit of the example's model, loss and optimizer: under MultiWorkerMirroredStrategy (in
    its scope, each replica given its own batches), or with Caramel's optimizer and callback."""

    def data() -> tf.data.Dataset:
        return tf.data.Dataset.range(steps).map(lambda step: example.batch(step, me))

    callbacks: list[tf.keras.callbacks.Callback] = [StepLogCallback(times)]
    if strategy == "mwms":
        with cast(tf.distribute.Strategy, mwms_strategy).scope():  # joined with MWMS
            example.model.compile(optimizer=example.optimizer, loss=example.loss, steps_per_execution=steps_per_execution)
        mwms.keras_fit_workarounds(mwms_strategy)
        example.model.fit(mwms.per_replica_dataset(mwms_strategy, data), epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
        return
    example.model.compile(optimizer=ctf.DistributedOptimizer(example.optimizer), loss=example.loss, steps_per_execution=steps_per_execution)
    callbacks.append(TrainingCallback(example.model))
    example.model.fit(data(), epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)


if __name__ == "__main__":
    main()
