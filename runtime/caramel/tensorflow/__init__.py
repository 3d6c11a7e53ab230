"""Caramel's TensorFlow API for training scripts: drop-ins for Horovod's tape and optimizer.

    import caramel.tensorflow as ctf
    ctf.init()
    tape = ctf.DistributedGradientTape(tape)         # instead of hvd.DistributedGradientTape
    optimizer = ctf.DistributedOptimizer(optimizer)  # instead of hvd.DistributedOptimizer

    @ctf.function(steps_per_execution=4)             # several steps per graph: the
    def train_step(features, labels): ...            # cross-iteration transfer window

Gradients are averaged over all ranks, so the result is that of synchronous SGD on the global
batch: in several steps per graph by the plan in force or Horovod's own way, whichever measured
faster, built into the step's graph as Horovod collectives; in a step of any other graph as
Horovod's tape sends them (see communicator.py). Keras users compile with `ctf.DistributedOptimizer` and fit with
`caramel.tensorflow.keras.TrainingCallback`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.tensorflow.process import communicator, init, rank, size
from caramel.tensorflow.steps import StepFunction, function

__all__ = [
    "DistributedGradientTape",
    "DistributedOptimizer",
    "StepFunction",
    "allreduce_gradients",
    "broadcast_variables",
    "communicator",
    "function",
    "init",
    "rank",
    "size",
]


def allreduce_gradients(gradients: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list[tf.Tensor | None]:
    """Average gradients over all ranks; None entries (unconnected variables) stay None.

    Works eagerly and inside graphs; sparse gradients are reduced as dense tensors.
    """
    present = [i for i, gradient in enumerate(gradients) if gradient is not None]
    if not present:
        return list(gradients)
    reduced = communicator().allreduce([tf.convert_to_tensor(gradients[i]) for i in present])
    averaged: list[tf.Tensor | None] = list(gradients)
    for index, tensor in zip(present, reduced):
        averaged[index] = tensor
    return averaged


class DistributedGradientTape:
    """Wraps a tf.GradientTape so that gradient() returns gradients averaged over all ranks."""

    def __init__(self, tape: tf.GradientTape) -> None:
        self._tape = tape

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        gradients = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        return tf.nest.pack_sequence_as(gradients, allreduce_gradients(flat))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def DistributedOptimizer(optimizer: tf.keras.optimizers.Optimizer) -> tf.keras.optimizers.Optimizer:  # noqa: N802 (Horovod's name)
    """The same Keras optimizer, whose apply_gradients() first averages the gradients over all ranks.

    It is an instance of a subclass of the optimizer's own class, as Horovod's is, so that
    `model.compile`, `minimize` and checkpoints take it as the optimizer it wraps; it starts
    from the given optimizer's configuration.
    """
    base = type(optimizer)
    if getattr(base, "_caramel_distributed", False):
        return optimizer

    def apply_gradients(self: Any, grads_and_vars: Iterable[tuple[Any, tf.Variable]], *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        averaged = allreduce_gradients([gradient for gradient, _ in pairs])
        # The ranks' gradients are averaged already. Keras' own aggregation, an identity
        # without a tf.distribute strategy, goes through tf.custom_gradient, which registers a
        # gradient function globally on every trace and so keeps every traced step graph alive.
        kwargs.setdefault("experimental_aggregate_gradients", False)
        return base.apply_gradients(self, zip(averaged, [variable for _, variable in pairs]), *args, **kwargs)

    distributed = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "_caramel_distributed": True})
    return distributed.from_config(optimizer.get_config())


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Overwrite variables on every rank with rank root_rank's values."""
    hvd.broadcast_variables(list(variables), root_rank=root_rank)
