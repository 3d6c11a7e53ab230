"""One worker of the emulated-accelerator benchmark: a Keras model whose layer compute is slept,
trained through one of the public APIs; the communication is real.

The model (emulated_model.py) has the profiled model's parameter tensors, grouped into layers
that take the profile's forward and backward times; its gradients are real tensors of the true
sizes, averaged over the shaped links by the strategy's real collectives.

    --strategy horovod       plain Horovod (Gloo), as its TF2 examples have it: its tape only
                             (benchmarks/plain_horovod.py: Caramel's horovod package bypassed)
    --strategy hvd-script    the same loop, unchanged, under Caramel: its `import horovod.tensorflow`
                             is Caramel's horovod package (on the backend spec.caramel.backend names)
    --strategy mwms          TensorFlow's MultiWorkerMirroredStrategy over gRPC (benchmarks/mwms.py)
    --strategy caramel       the same script with Caramel's drop-ins, on the backend the job's
                             spec.caramel.backend names (auto: horovod wherever Horovod is
                             installed, tensorflow elsewhere)
    --strategy compute-only  the same training with a plain optimizer or tape: no communication
    --strategy comm-only     every gradient-sized tensor allreduced at once, plain Horovod's defaults
    --strategy comm-only-tf  every gradient-sized tensor averaged at once by MultiWorkerMirroredStrategy

    --api fit       model.fit: ctf.DistributedOptimizer and TrainingCallback (caramel), or the
                    model and optimizer made in the strategy's scope (mwms, with the workarounds
                    Keras 3 needs there, see mwms.py), or a plain optimizer (compute-only); every
                    strategy compiles with the same --steps-per-execution (Keras runs them in a
                    tf.while_loop, Caramel as copies of one step in one graph). Horovod's own fit
                    (hvd.DistributedOptimizer and its callbacks) needs Keras 2 and is gone.
    --api tape      a tf.function step called once per step with hvd.DistributedGradientTape or
                    ctf.DistributedGradientTape (Horovod's TF2 examples, import swapped), or, for
                    mwms, strategy.run of a plain tape step (TensorFlow's custom-loop tutorial)

    --kernels graph-ops     the layers' compute as ops of the step's graph that sleep where they run
    --kernels device-clock  the layers' compute on one emulated device's clock (emulated_model.py)
    --gradients computed|weights|unshaped  how the gradients are made (emulated_model.py; default computed)
    --api function  the tape step through ctf.function, --steps-per-execution steps per graph
                    (caramel only)

Rank 0 prints a JSON line per measured step; every rank prints a JSON summary at the end. Run it
through the benchmark driver (`python -m benchmarks.scheduling_bench`), which starts it as a
Caramel worker in a network namespace.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import cast

import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks import emulated_model, mwms
from benchmarks.joining import join
from benchmarks.loops import train_in_executions, train_per_step, training_step
from benchmarks.plain_horovod import variables_of
from benchmarks.profiles import load_profile, scaled
from benchmarks.worker_args import add_run_arguments, parse_run_arguments
from benchmarks.worker_events import (
    StepLog,
    StepLogCallback,
    allreduce_all_at_once,
    allreduce_all_at_once_tf,
    caramel_details,
    print_summary,
)
from benchmarks.workloads import (
    APIS,
    CARAMEL_WORKERS,
    COMPUTED,
    FIT,
    FIT_AS_HOROVOD_COMPILES,
    GRADIENTS,
    GRAPH_OPS,
    KERNELS,
    WORKER_APIS,
    WORKER_STRATEGIES,
    compiled_steps_per_execution,
)
from caramel.tensorflow.keras import TrainingCallback

# Updates that leave the weights (and so the gradients) practically unchanged; they still cost
# what a real update costs.
LEARNING_RATE = 1e-9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="a profile of benchmarks/profiles")
    parser.add_argument("--strategy", required=True, choices=WORKER_STRATEGIES)
    parser.add_argument("--api", choices=APIS, help="the public API that trains (default: tape for horovod, fit for the others)")
    add_run_arguments(parser, measured_steps=32)
    parser.add_argument("--device-tflops", type=float, help="emulated device rate; default: the profile's")
    parser.add_argument("--kernels", choices=KERNELS, default=GRAPH_OPS, help=f"how the emulated compute runs (default {GRAPH_OPS})")
    parser.add_argument("--gradients", choices=GRADIENTS, default=COMPUTED, help=f"how the emulated gradients are made (default {COMPUTED})")
    return parse_run_arguments(parser, "emulated", WORKER_APIS)


def main() -> None:
    args = parse_args()
    joined = join(args.strategy, args.whole_job)
    hvd, strategy = joined.hvd, joined.mwms_strategy
    profile = load_profile(args.profile)
    if args.device_tflops:
        profile = scaled(profile, args.device_tflops)
    with joined.scope():
        model = emulated_model.build_model(profile, args.kernels, args.gradients)
    times = StepLog(args.warmup, f"{args.strategy}-{args.api}")
    total = args.warmup + args.steps
    details: dict = {}
    if args.strategy == "comm-only":
        allreduce_all_at_once(cast(ModuleType, hvd), [tf.convert_to_tensor(variable) for variable in model.trainable_variables], total, times)
    elif args.strategy == "comm-only-tf":
        allreduce_all_at_once_tf(strategy, [tf.convert_to_tensor(variable) for variable in model.trainable_variables], total, times)
    elif args.api in (FIT, FIT_AS_HOROVOD_COMPILES):
        with joined.scope():
            fit(model, args.strategy, total, compiled_steps_per_execution(args.api, args.steps_per_execution), times, strategy)
    else:
        loop(model, args.strategy, args.api, total, args.steps_per_execution, times, hvd, strategy)
    if args.strategy in CARAMEL_WORKERS:
        details = caramel_details()
    print_summary(args.strategy, times, details)


def fit(
    model: tf.keras.Model, strategy: str, steps: int, steps_per_execution: int, times: StepLog, mwms_strategy: tf.distribute.Strategy | None
) -> None:
    sgd = tf.keras.optimizers.SGD(LEARNING_RATE)
    optimizer = ctf.DistributedOptimizer(sgd) if strategy == "caramel" else sgd
    model.compile(optimizer=optimizer, loss=emulated_model.loss, steps_per_execution=steps_per_execution)
    callbacks: list[tf.keras.callbacks.Callback] = [StepLogCallback(times)]
    data = emulated_model.dataset()
    if strategy == "caramel":
        callbacks.append(TrainingCallback(model))
    elif strategy == "mwms":
        mwms.keras_fit_workarounds(mwms_strategy)
        data = mwms.per_replica_dataset(mwms_strategy, emulated_model.dataset)
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)


def loop(
    model: tf.keras.Model,
    strategy: str,
    api: str,
    steps: int,
    steps_per_execution: int,
    times: StepLog,
    hvd: ModuleType | None,
    mwms_strategy: tf.distribute.Strategy | None,
) -> None:
    # Every path reads the same input pipeline through a live iterator, as Horovod's TF2 examples
    # do (`for images, labels in dataset`): a whole job's time then includes the iterator's teardown
    # on every path, not only on those that take a dataset (ctf.function's and Keras fit's).
    batches = iter(emulated_model.dataset())

    def next_batch(step: int) -> tuple[tf.Tensor, tf.Tensor]:
        return next(batches)

    if strategy == "mwms":
        with cast(tf.distribute.Strategy, mwms_strategy).scope():  # joined with MWMS
            optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
            optimizer.build(model.trainable_variables)
        train_per_step(mwms.loop_step(mwms_strategy, model, optimizer, emulated_model.loss), next_batch, steps, times)
        return
    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(model.trainable_variables)
    variables = [*model.variables, *optimizer.variables]
    if strategy == "horovod":
        hvd = cast(ModuleType, hvd)  # joined with Horovod
        hvd.broadcast_variables(variables_of(variables), root_rank=0)
        train_step = training_step(model, optimizer, emulated_model.loss, hvd.DistributedGradientTape, sources=variables_of)
    elif strategy == "hvd-script":
        hvd = cast(ModuleType, hvd)  # joined with Caramel's Horovod
        hvd.broadcast_variables(variables, root_rank=0)
        train_step = training_step(model, optimizer, emulated_model.loss, hvd.DistributedGradientTape)
    elif strategy == "caramel":
        ctf.broadcast_variables(variables, root_rank=0)
        train_step = training_step(model, optimizer, emulated_model.loss, ctf.DistributedGradientTape)
    else:
        train_step = training_step(model, optimizer, emulated_model.loss, lambda plain: plain)
    if api == "tape":
        train_per_step(train_step, next_batch, steps, times)
    else:
        train_in_executions(train_step, emulated_model.dataset(), steps, steps_per_execution, times)


if __name__ == "__main__":
    main()
