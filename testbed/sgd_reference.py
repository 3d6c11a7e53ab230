"""What plain synchronous SGD gives on the tests' small model: one model, each step's gradient that
of the mean loss over every rank's batch, applied by the small model's optimizer. Computed in the
process that asks, on the Keras `tf.keras` is there (the weights a seed initializes differ between
Keras 2 and Keras 3), or, for another Keras, in a process of its own:

    TF_USE_LEGACY_KERAS=1 python -m testbed.sgd_reference --steps 15 --ranks 2 --batch-size 16 --hidden 32 --output weights.npz
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf

from testbed import small_model


def synchronous_sgd(steps: int, ranks: int, batch_size: int, hidden: int) -> list[np.ndarray]:
    """The trainable weights after `steps` steps of synchronous SGD over `ranks` ranks' batches."""
    tf.keras.utils.set_random_seed(small_model.SEED)
    model = small_model.build_model(hidden)
    optimizer = small_model.build_optimizer(small_model.DEFAULT_LEARNING_RATE)
    for step in range(1, steps + 1):
        with tf.GradientTape() as tape:
            batches = [small_model.batch(step, rank, batch_size) for rank in range(ranks)]
            loss = tf.add_n([small_model.LOSS(labels, model(features)) for features, labels in batches]) / ranks
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return [variable.numpy() for variable in model.trainable_variables]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--steps", "--ranks", "--batch-size", "--hidden"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--output", required=True, help="where the weights go (.npz)")
    args = parser.parse_args()
    np.savez(args.output, *synchronous_sgd(args.steps, args.ranks, args.batch_size, args.hidden))


if __name__ == "__main__":
    main()
