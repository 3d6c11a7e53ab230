"""A training process for the test that scripts written for Horovod's API give the results of
synchronous SGD: the tests' small model and data (testbed/small_model.py), trained through
Caramel's `horovod` package as Horovod's examples train, rank 0 saving its final weights.

    --api tape    `import horovod.tensorflow as hvd`: a tf.function per step with
                  hvd.DistributedGradientTape, the variables broadcast from rank 0 after the first
                  step (Horovod's tensorflow2_mnist.py)
    --api keras   `import horovod.tensorflow.keras as hvd`: model.fit with hvd.DistributedOptimizer,
                  MetricAverageCallback, BroadcastGlobalVariablesCallback(0) (second in the list:
                  Caramel's callback runs first anyway) and LearningRateWarmupCallback over
                  --warmup-epochs (Horovod's tensorflow2_keras_mnist.py); with
                  --backward-passes N the optimizer accumulates N passes per update (Horovod's
                  backward_passes_per_step), with --steps-per-execution the steps run several
                  per graph (compile's), with --unbuilt the model has no input shape (Keras
                  builds it in the first step, after which the variables are broadcast)

Every rank starts from weights of its own (seed SEED + rank), so that only the broadcast makes
them agree. The optimizer is SGD with momentum, which the warm-up's momentum correction scales.
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np
import tensorflow as tf

MOMENTUM = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, choices=("tape", "keras"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, required=True)
    parser.add_argument("--warmup-epochs", type=int, default=0, help="keras: LearningRateWarmupCallback's (0: none)")
    parser.add_argument("--backward-passes", type=int, default=1, help="keras: DistributedOptimizer's backward_passes_per_step")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="keras: compile's steps_per_execution")
    parser.add_argument("--unbuilt", action="store_true", help="keras: the model built by its first batch")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--output", required=True, help="where rank 0 saves the final weights (.npz)")
    args = parser.parse_args()
    hvd = importlib.import_module("horovod.tensorflow" if args.api == "tape" else "horovod.tensorflow.keras")
    hvd.init()
    # After init, as Horovod scripts do: on TensorFlow's collectives, tensors made before the
    # ranks join (small_model's teacher) live on a device that a graph made after cannot use.
    from testbed.small_model import SEED, build_model

    tf.keras.utils.set_random_seed(SEED + hvd.rank())
    model = build_model(args.hidden, built=not args.unbuilt)
    optimizer = tf.keras.optimizers.SGD(args.learning_rate, momentum=MOMENTUM)
    steps = args.epochs * args.steps_per_epoch
    if args.api == "tape":
        train_with_tape(hvd, model, optimizer, steps, args.batch_size)
    else:
        train_with_fit(hvd, model, optimizer, args)
    if hvd.rank() == 0:
        np.savez(args.output, *[variable.numpy() for variable in model.trainable_variables])


def train_with_tape(hvd, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, steps: int, batch_size: int) -> None:
    from testbed.small_model import LOSS, batch

    @tf.function
    def training_step(features, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features, training=True))
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    for step in range(1, steps + 1):
        training_step(*batch(tf.constant(step, tf.int64), hvd.rank(), batch_size), step == 1)


def train_with_fit(hvd, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, args: argparse.Namespace) -> None:
    from testbed.small_model import LOSS, batch

    model.compile(
        optimizer=hvd.DistributedOptimizer(optimizer, backward_passes_per_step=args.backward_passes), loss=LOSS,
        steps_per_execution=args.steps_per_execution, experimental_run_tf_function=False,
    )  # fmt: skip
    callbacks = [hvd.callbacks.MetricAverageCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if args.warmup_epochs:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.learning_rate, warmup_epochs=args.warmup_epochs))
    rank = hvd.rank()
    data = tf.data.Dataset.range(1, args.epochs * args.steps_per_epoch + 1).map(lambda step: batch(step, rank, args.batch_size))
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=0)
    print(f"iterations {int(model.optimizer.iterations.numpy())}", flush=True)


if __name__ == "__main__":
    main()
