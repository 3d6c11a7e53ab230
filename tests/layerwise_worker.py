"""A layer-wise training loop on Caramel's TransferEngine, run by the correctness tests.

Each layer's gradient depends on its current weights (0.5 w plus per-rank noise), so a forward
pass that read a parameter before its update had landed would change the result. Rank 0 saves
the final weights for the test to compare with plain synchronous SGD.
"""

import argparse
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from caramel.job.contract import WorkerContract
from caramel.tensorflow.engine import TransferEngine
from caramel.planner.schedule import TensorCost

SIZES = [3, 1000, 70_000, 5, 300_000, 17]
LEARNING_RATE = 0.1


def noise(step: int, rank: int, index: int) -> tf.Tensor:
    return tf.random.stateless_normal([SIZES[index]], seed=[step * 100 + index, rank])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    hvd.init()
    weights = [tf.Variable(tf.zeros([size])) for size in SIZES]

    def apply_update(piece, average):
        part = weights[piece.tensor][piece.start : piece.stop]
        weights[piece.tensor][piece.start : piece.stop].assign(part - LEARNING_RATE * average)

    costs = [TensorCost(size * 4, 4, 0.001, 0.002) for size in SIZES]
    engine = TransferEngine(costs, WorkerContract.from_env().scheduling, apply_update)
    for step in range(args.steps):
        for index in range(len(SIZES)):
            engine.wait_updated(step - 1, index)
            time.sleep(0.001)
        for index in reversed(range(len(SIZES))):
            time.sleep(0.002)
            engine.gradient_ready(step, index, 0.5 * weights[index] + noise(step, hvd.rank(), index))
    engine.wait_all_updated(args.steps - 1)
    engine.close()
    if hvd.rank() == 0:
        np.savez(args.output, *[w.numpy() for w in weights])
    print(f"caramel: plan changes {engine.plan_changes}, transfers per step {len(engine.plan.transfers)}", flush=True)


if __name__ == "__main__":
    main()
