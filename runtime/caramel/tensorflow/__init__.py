"""Caramel's TensorFlow API for training scripts: drop-ins for Horovod's tape and optimizer.

    import caramel.tensorflow as ctf
    ctf.init()
    tape = ctf.DistributedGradientTape(tape)       # instead of hvd.DistributedGradientTape
    optimizer = ctf.DistributedOptimizer(optimizer)  # instead of hvd.DistributedOptimizer

Gradients are averaged over all ranks by the process's GradientCommunicator, which applies the
job's scheduling settings, so the result is that of synchronous SGD on the global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.tensorflow.communicator import GradientCommunicator, signature_of
from caramel.job.contract import WorkerContract

_communicator: GradientCommunicator | None = None


def init() -> WorkerContract:
    """Join the job's Horovod ranks; call once per process before any other Caramel call."""
    global _communicator
    contract = WorkerContract.from_env()
    hvd.init()
    _communicator = GradientCommunicator(contract.scheduling, contract.tuning)
    return contract


def communicator() -> GradientCommunicator:
    if _communicator is None:
        raise RuntimeError("caramel.tensorflow.init() must be called first")
    return _communicator


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


def allreduce_gradients(gradients: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list[tf.Tensor | None]:
    """Average gradients over all ranks; None entries (unconnected variables) stay None.

    Works eagerly and inside tf.function; sparse gradients are reduced as dense tensors.
    """
    present = [i for i, gradient in enumerate(gradients) if gradient is not None]
    dense = [tf.convert_to_tensor(gradients[i]) for i in present]
    if not dense:
        return list(gradients)
    if tf.executing_eagerly():
        reduced = communicator().allreduce(dense)
    elif all(tensor.shape.is_fully_defined() for tensor in dense):
        reduced = _overlapped_allreduce(dense)
    else:  # shapes known only at run time: handed over together once all exist
        reduced = _averages_op(lambda *tensors: communicator().allreduce(tensors), dense, dense, "caramel_allreduce_gradients")
    averaged: list[tf.Tensor | None] = list(gradients)
    for index, tensor in zip(present, reduced):
        averaged[index] = tensor
    return averaged


def _overlapped_allreduce(dense: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """In a graph: every gradient is handed over by its own op, which runs as soon as
    backpropagation has produced it, and one op waits for all the averages.

    The hand-over ops are stateful, so tf.function runs them in the order they are created;
    they are created last gradient first, the order in which backpropagation produces them.
    """
    signature = signature_of(dense)
    shapes = [tensor.shape for tensor in dense]

    def hand_over(index: int, gradient: tf.Tensor) -> tf.Tensor:
        communicator().hand_over(signature, index, gradient)
        return tf.constant(index)

    handed_over = [
        tf.py_function(lambda gradient, index=index: hand_over(index, gradient), [dense[index]], Tout=tf.int32, name="caramel_hand_over")
        for index in reversed(range(len(dense)))
    ]
    return _averages_op(lambda *_: communicator().collect(shapes), handed_over, dense, "caramel_collect_gradients")


def _averages_op(function: Callable[..., list[tf.Tensor]], inputs: Sequence[tf.Tensor], gradients: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """A graph op running `function` on `inputs` in Python, returning averages like `gradients`."""
    averages = tf.py_function(function, list(inputs), Tout=[gradient.dtype for gradient in gradients], name=name)
    for average, gradient in zip(averages, gradients):
        average.set_shape(gradient.shape)
    return averages


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


class DistributedOptimizer:
    """Wraps a Keras optimizer so that apply_gradients() first averages the gradients over all ranks."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, tf.Variable]], **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        averaged = allreduce_gradients([gradient for gradient, _ in pairs])
        return self._optimizer.apply_gradients(zip(averaged, [variable for _, variable in pairs]), **kwargs)

    def minimize(self, loss: Any, var_list: Any, tape: tf.GradientTape | None = None) -> Any:
        return self.apply_gradients(self._optimizer.compute_gradients(loss, var_list, tape=tape))

    @property
    def inner(self) -> Any:
        """The wrapped optimizer, for checkpoints and direct access to its state."""
        return self._optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Overwrite variables on every rank with rank root_rank's values."""
    hvd.broadcast_variables(list(variables), root_rank=root_rank)
