"""A training process for the correctness tests: the tests' small model (testbed/small_model.py),
trained through one of Caramel's public paths, its final weights saved by rank 0.

    --api tape-fit       TrainingRun.fit with ctf.DistributedGradientTape, several steps per graph
    --api optimizer-fit  TrainingRun.fit with ctf.DistributedOptimizer
    --api tape-loop      a tf.function per step with ctf.DistributedGradientTape, TrainingRun.steps()
    --api eager          eager steps with ctf.DistributedGradientTape (no graph: the backend's eager path)
    --api keras          model.fit with ctf.DistributedOptimizer and ctf.keras.TrainingCallback

Every path must give the weights of plain synchronous SGD on the global batch: the model's
gradients depend on its weights, so a step that read a parameter before its update had landed,
or an update applied twice or not at all, would change them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.tensorflow.keras import TrainingCallback
from caramel.tensorflow.runtime import plan_with
from caramel.tensorflow.training import TrainingRun
from testbed.lab import lab_policy
from testbed.small_model import DEFAULT_LEARNING_RATE, LOSS, SEED, batch, build_model, build_optimizer

APIS = ("tape-fit", "optimizer-fit", "tape-loop", "eager", "keras")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, choices=APIS)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--output", required=True, help="where rank 0 saves the final weights (.npz)")
    args = parser.parse_args()
    # These runs are far too short for a graph of several steps to repay its build, so the
    # replanner would keep one step per graph; the graphs of several steps are what must be
    # checked here (the first steps of every run still go one per graph).
    plan_with(replace(lab_policy(), long_training=True))  # with a test's lab settings (testbed/lab.py)
    ctf.init()
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(args.hidden)
    optimizer = build_optimizer(DEFAULT_LEARNING_RATE)

    def batch_of(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return batch(step, ctf.rank(), args.batch_size)

    if args.api == "keras":
        model.compile(optimizer=ctf.DistributedOptimizer(optimizer), loss=LOSS, steps_per_execution=args.steps_per_execution)
        callback = TrainingCallback(model)
        model.fit(tf.data.Dataset.range(1, args.steps + 1).map(batch_of), epochs=1, steps_per_epoch=args.steps, callbacks=[callback], verbose=0)
    else:
        train(args, model, optimizer, batch_of)
    if ctf.rank() == 0:
        np.savez(args.output, *[variable.numpy() for variable in model.trainable_variables])


def train(args: argparse.Namespace, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, batch_of) -> None:
    distributed = ctf.DistributedOptimizer(optimizer) if args.api == "optimizer-fit" else optimizer
    run = TrainingRun(model, distributed, total_steps=args.steps, batch_size=args.batch_size)

    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features, training=True))
        if args.api == "optimizer-fit":
            distributed.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        else:
            gradients = ctf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    if args.api in ("tape-fit", "optimizer-fit"):
        run.fit(step, batch_of, steps_per_execution=args.steps_per_execution)
        return
    graph_step = tf.function(step) if args.api == "tape-loop" else step
    for number in run.steps():
        run.report_loss(graph_step(*batch_of(tf.constant(number, tf.int64))))


if __name__ == "__main__":
    main()
