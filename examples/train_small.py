"""A small real model on synthetic data: an MLP learns a fixed random teacher's classes.

Fast enough for tests and the quickstart. Every (step, rank) pair draws its own batch from a
stateless seed, so a run resumed from a checkpoint sees exactly the data an uninterrupted run
would have seen, and its weights continue exactly.
"""

import argparse
import functools

import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.tensorflow.training import TrainingRun

FEATURES = 32
CLASSES = 10
SEED = 1234  # rank 0's initial weights are broadcast to every rank anyway
TEACHER_SEED = [7, 7]
DEFAULT_LEARNING_RATE = 0.05
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="total training steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per rank per step (default 64)")
    parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers (default 256)")
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help="SGD learning rate (default 0.05)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=4, help="steps run in one graph execution (default 4)"
    )
    return parser.parse_args()


@functools.cache
def teacher() -> tf.Tensor:
    """The weights whose classes the model learns: the same on every rank and in every run. Made
    at its first use, after init (no TensorFlow op runs before it), eagerly even from a trace."""
    with tf.init_scope():
        return tf.random.stateless_normal([FEATURES, CLASSES], seed=TEACHER_SEED)


def batch(step: int, rank: int, size: int) -> tuple[tf.Tensor, tf.Tensor]:
    features = tf.random.stateless_normal([size, FEATURES], seed=[step, rank])
    labels = tf.argmax(features @ teacher(), axis=1)
    return features, labels


def build_model(hidden: int) -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(hidden, activation="relu"),
            tf.keras.layers.Dense(hidden, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.build((None, FEATURES))
    return model


def build_optimizer(learning_rate: float) -> tf.keras.optimizers.Optimizer:
    return tf.keras.optimizers.SGD(learning_rate, momentum=0.9)


def main() -> None:
    args = parse_args()
    # First, before any TensorFlow op: on the tensorflow backend, init starts TensorFlow in the
    # job's cluster, and a variable made before it cannot be used after.
    ctf.init()
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(args.hidden)
    optimizer = build_optimizer(args.learning_rate)
    def train_step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(features, training=True))
        # The tape averages the gradients over all ranks (see train_resnet50.py for the optimizer wrapper).
        gradients = ctf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    run = TrainingRun(model, optimizer, total_steps=args.steps, batch_size=args.batch_size)
    run.fit(train_step, lambda step: batch(step, ctf.rank(), args.batch_size), steps_per_execution=args.steps_per_execution)


if __name__ == "__main__":
    main()
