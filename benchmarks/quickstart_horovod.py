"""The quickstart's model and data trained by plain Horovod, as Horovod's TF2 examples train: the
baseline of `quickstart_bench.py` for `caramel run examples/quickstart.yaml`.

    caramel run job.yaml   # spec.command: [python, -m, benchmarks.quickstart_horovod], the quickstart's args

The MLP, its optimizer, loss and synthetic batches are examples/train_small.py's own, with its
arguments (`--steps`, `--batch-size`, `--hidden`, `--learning-rate`; `--steps-per-execution` is
taken and ignored: Horovod runs one step per tf.function call). Horovod is plain Horovod over
Gloo, imported past Caramel's own `horovod` package, which Caramel's entrypoint puts first on the
path (plain_horovod.py); its tape is given the Keras 3 variables' `tf.Variable`s (horovod#4290).
Each step is a call of one `tf.function` with `hvd.DistributedGradientTape`, the initial weights
broadcast from rank 0 first. Rank 0 ends with the line Caramel's runs end with (a final
`caramel-progress` report), its step time the median over the steps after the first, which
traces the step, each timed from its batch's making to its loss, as `TrainingRun.steps` times
them; so `caramel run` and the benchmark read both runs alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

from benchmarks.plain_horovod import horovod_tensorflow, variables_of
from benchmarks.workloads import example_script
from caramel.contract.progress import ProgressReport, format_report


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total training steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per rank per step (default 64)")
    parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers (default 256)")
    parser.add_argument("--learning-rate", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="ignored: one step per tf.function call, as Horovod runs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd = horovod_tensorflow()
    hvd.init()
    train_small = example_script("train_small")  # its module-level tensors after Horovod's set-up, as a script's would be
    loss_of, batch = train_small["LOSS"], train_small["batch"]

    tf.keras.utils.set_random_seed(train_small["SEED"])
    model = train_small["build_model"](args.hidden)
    optimizer = train_small["build_optimizer"](args.learning_rate)
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(variables_of([*model.variables, *optimizer.variables]), root_rank=0)

    @tf.function
    def train_step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_of(labels, model(features, training=True))
        gradients = hvd.DistributedGradientTape(tape).gradient(loss, variables_of(model.trainable_variables))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    seconds, loss = [], float("nan")
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        loss = float(train_step(*batch(step, hvd.rank(), args.batch_size)))
        seconds.append(time.perf_counter() - started)
    if hvd.rank() == 0:
        median = statistics.median(seconds[1:] or seconds or [0.0])
        examples_per_second = args.batch_size * hvd.size() / median if median > 0 else 0.0
        print(format_report(ProgressReport(args.steps, args.steps, loss, median, examples_per_second, final=True)), flush=True)


if __name__ == "__main__":
    main()
