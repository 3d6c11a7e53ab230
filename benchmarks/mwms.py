"""TensorFlow's MultiWorkerMirroredStrategy as a benchmark baseline, set up from Caramel's worker
contract: TensorFlow's own maintained way to train on several workers.

`strategy()` writes TF_CONFIG from the contract (`WorkerContract.from_env()`: every rank's
collective address, `collective_addresses`, the ports Caramel's tensorflow backend serves on, and
this process's rank) and makes the strategy with its defaults: CPU collectives over gRPC, ring
all-reduce, the gradients reversed and packed into one all-reduce per dtype (`bytes_per_pack` 0).
A benchmark worker runs either MWMS or Caramel, never both, so the ports are free.

Keras 3's `model.fit` under MWMS does not run as the tutorial has it here (TensorFlow 2.21, Keras
3.15, keras#20585). Measured with two ranks on loopback, three things break, each in Keras 3's
TensorFlow trainer, not in the strategy:
1. before the first step, `fit` reduces the first batch, a tuple of per-replica tensors, with one
   `strategy.reduce` call, which takes a single value: "Attempt to convert a value (PerReplica...)";
2. every step reduces its logs (the loss, a scalar) with `strategy.reduce("MEAN", v, axis=0)`:
   "Invalid reduction dimension 0 for input with 0 dimensions";
3. with steps_per_execution above 1, the step (a tf.function) is called inside the trainer's
   `tf.while_loop` and `tf.cond`, where the strategy's collectives take their instance keys as
   call-time captures, which do not reach through the control flow: "You must feed a value for
   placeholder tensor 'while/.../cond/Placeholder' with dtype int32".
`keras_fit_workarounds` is the smallest form found that runs: the strategy's `reduce` applied to
each value of a structure, scalars reduced over the replicas (axis None), and instance keys given
at trace time (`CollectiveReplicaLauncher._prefer_unique_instance_key = False`, the setting of
TensorFlow's own graph-mode collectives; every rank traces the same functions in the same order
here). None of them changes how the gradients are averaged: with them, two ranks at 1 and 2 steps
per execution ended on the weights of synchronous SGD on the global batch (to 2e-7). The
benchmark's `mwms-loop` needs none of them: a custom training loop, `strategy.run` in a
`tf.function` called once per step (TensorFlow's custom-training-loop tutorial).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from caramel.contract.env import WorkerContract


def tf_config(contract: WorkerContract) -> dict:
    """TF_CONFIG of this training process: one worker task per rank, at its collective address."""
    workers = [f"{host}:{port}" for host, port in contract.collective_addresses]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": contract.required_rank}}


def strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """The job's MultiWorkerMirroredStrategy, with its own defaults; call before any other
    TensorFlow op of the process (the strategy starts the process's TensorFlow server)."""
    os.environ["TF_CONFIG"] = json.dumps(tf_config(WorkerContract.from_env()))
    return tf.distribute.MultiWorkerMirroredStrategy()


def keras_fit_workarounds(strategy: tf.distribute.Strategy) -> None:
    """What Keras 3's `model.fit` needs to run under MultiWorkerMirroredStrategy here (see the
    module's docstring); call before `fit`."""
    from tensorflow.python.distribute import cross_device_utils

    cross_device_utils.CollectiveReplicaLauncher._prefer_unique_instance_key = False
    reduce = strategy.reduce

    def reduce_each(reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        def one(item: Any) -> Any:
            scalar = strategy.experimental_local_results(item)[0].shape.rank == 0
            return reduce(reduce_op, item, axis=None if scalar else axis)

        return tf.nest.map_structure(one, value)

    strategy.reduce = reduce_each


def per_replica_dataset(strategy: tf.distribute.Strategy, make: Callable[[], tf.data.Dataset]) -> Any:
    """A dataset whose every element is one replica's batch, as `make()` gives it (no rebatching of
    a global batch over the workers), for `fit` or a custom loop."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return strategy.distribute_datasets_from_function(lambda context: make().with_options(options))


def loop_step(
    strategy: tf.distribute.Strategy,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """One training step of a custom loop under the strategy, for a `tf.function` per step: each
    replica's loss over the replicas, so that the optimizer's sum of the gradients over them (Keras'
    `apply_gradients` in a replica context) is their average. Returns this replica's loss."""
    variables = model.trainable_variables
    replicas = strategy.num_replicas_in_sync

    def replica_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            value = loss(labels, model(inputs, training=True))
            scaled = value / replicas
        gradients = tape.gradient(scaled, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        return value

    def step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        return strategy.experimental_local_results(strategy.run(replica_step, args=(inputs, labels)))[0]

    return step


def all_reduce(strategy: tf.distribute.Strategy, tensors: Sequence[tf.Tensor]) -> Any:
    """Every tensor averaged over the replicas at once, as the strategy averages a step's gradients
    (reversed, packed into one all-reduce per dtype): for a tf.function."""

    def replica(*values: tf.Tensor) -> list[tf.Tensor]:
        # Copies on the replica's device: the strategy reduces a tensor to where it lives, and the
        # function's inputs live nowhere yet.
        local = [tf.identity(value) for value in values]
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, local)

    return strategy.run(replica, args=tuple(tensors))
