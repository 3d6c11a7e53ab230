"""Keras `model.fit` with Caramel: the MLP of train_small.py, compiled with Caramel's optimizer.

What changes from single-process Keras: `ctf.init()`, `ctf.DistributedOptimizer` around the
optimizer, and `TrainingCallback`, which broadcasts the initial weights, runs the
`steps_per_execution` steps of each execution in one graph with Caramel's scheduling, records
metrics and progress, checkpoints and resumes. The data of step s is drawn from a stateless seed
(s, rank), as in train_small.py, so a resumed run sees exactly the data of an uninterrupted one.
"""

import argparse

import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.tensorflow.keras import TrainingCallback
from train_small import DEFAULT_LEARNING_RATE, LOSS, SEED, batch, build_model, build_optimizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs (default 4)")
    parser.add_argument("--steps-per-epoch", type=int, default=50, help="steps per epoch (default 50)")
    parser.add_argument("--steps-per-execution", type=int, default=4, help="steps run in one graph execution (default 4)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per rank per step (default 64)")
    parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers (default 256)")
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help="SGD learning rate (default 0.05)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ctf.init()
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(args.hidden)
    model.compile(
        optimizer=ctf.DistributedOptimizer(build_optimizer(args.learning_rate)),
        loss=LOSS,
        steps_per_execution=args.steps_per_execution,
    )
    caramel = TrainingCallback(model)  # restores the latest checkpoint before fit: initial_epoch
    # The batches of the steps still to run: a resumed run starts at its checkpoint's epoch.
    first_step = caramel.initial_epoch * args.steps_per_epoch + 1
    steps = tf.data.Dataset.range(first_step, args.epochs * args.steps_per_epoch + 1)
    data = steps.map(lambda step: batch(step, ctf.rank(), args.batch_size))
    model.fit(
        data,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        initial_epoch=caramel.initial_epoch,
        callbacks=[caramel],
        verbose=0,
    )


if __name__ == "__main__":
    main()
