"""Caramel's TensorFlow API for training scripts: drop-ins for Horovod's tape and optimizer.

    import caramel.tensorflow as ctf
    ctf.init()
    tape = ctf.DistributedGradientTape(tape)         # instead of hvd.DistributedGradientTape
    optimizer = ctf.DistributedOptimizer(optimizer)  # instead of hvd.DistributedOptimizer

    @ctf.function(steps_per_execution=4)             # several steps per graph: the
    def train_step(features, labels): ...            # cross-iteration transfer window

Gradients are averaged over all ranks, so the result is that of synchronous SGD on the global
batch: in several steps per graph by the plan in force or the backend's own way, whichever
measured faster, built into the step's graph as the backend's collectives; in a step of any
other graph as the backend's own API sends them (see communicator.py). The drop-ins take
Horovod's keywords. Keras users compile with `ctf.DistributedOptimizer` and fit with
`caramel.tensorflow.keras.TrainingCallback`. Scripts written for Horovod's API run unchanged:
Caramel serves `horovod.tensorflow` itself (`caramel.compat`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from caramel.tensorflow.backends import ReduceOp
from caramel.tensorflow.compression import Compression, Compressor
from caramel.tensorflow.keras_version import check_optimizer, updating_through
from caramel.tensorflow.ledger import broadcast_variables as _broadcast_variables
from caramel.tensorflow.runtime import Runtime, current
from caramel.tensorflow.runtime import init as _init
from caramel.tensorflow.steps import StepFunction, function
from caramel.tensorflow.unsupported import NotSupportedByCaramel, refuse

__all__ = [
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "NotSupportedByCaramel",
    "Runtime",
    "StepFunction",
    "Sum",
    "allreduce_gradients",
    "broadcast_variables",
    "function",
    "init",
    "local_rank",
    "local_size",
    "rank",
    "size",
]

Average, Sum = ReduceOp.AVERAGE, ReduceOp.SUM
"""How gradients are reduced over the ranks (the drop-ins' `op`)."""


def init() -> Runtime:
    """Join the job's ranks; call once per process before any other Caramel call (later calls
    return the same runtime)."""
    return _init()


def rank() -> int:
    return current().rank


def size() -> int:
    return current().size


def local_rank() -> int:
    return current().backend.local_rank


def local_size() -> int:
    return current().backend.local_size


def allreduce_gradients(
    gradients: Sequence[tf.Tensor | tf.IndexedSlices | None], op: ReduceOp = Average, compression: type[Compressor] = Compression.none
) -> list[tf.Tensor | None]:
    """Average (or sum) gradients over all ranks; None entries (unconnected variables) stay None.

    Works eagerly and inside graphs; sparse gradients are reduced as dense tensors, and with
    `compression=Compression.fp16` floating-point gradients travel as float16.
    """
    present = [i for i, gradient in enumerate(gradients) if gradient is not None]
    if not present:
        return list(gradients)
    compressed = [compression.compress(tf.convert_to_tensor(gradients[i])) for i in present]
    reduced = current().communicator.allreduce([tensor for tensor, _ in compressed], op)
    result: list[tf.Tensor | None] = list(gradients)
    for index, tensor, (_, context) in zip(present, reduced, compressed):
        result[index] = compression.decompress(tensor, context)
    return result


class _HorovodOptions:
    """Horovod's keywords of DistributedGradientTape and DistributedOptimizer, checked once:
    what Caramel does as Horovod does, what it plans itself, and what it refuses by name."""

    def __init__(
        self,
        kind: str,
        *,
        device_dense: str = "",
        device_sparse: str = "",
        compression: type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        process_set: Any = None,
        scale_local_gradients: bool = True,
        backward_passes_per_step: int = 1,
        average_aggregated_gradients: bool = False,
        name: str | None = None,
    ) -> None:
        # device_*: where Horovod places its collectives' inputs on GPUs; the backend places them.
        # num_groups/groups: Horovod's fusion hints; Caramel plans the grouping of the transfers
        # itself. sparse_as_dense: Caramel reduces every gradient as a dense tensor anyway.
        # scale_local_gradients and average_aggregated_gradients matter only with features refused below.
        del device_dense, device_sparse, num_groups, groups, sparse_as_dense, scale_local_gradients, average_aggregated_gradients, name
        self.op = _reduce_op(op, kind)
        self.compression = compression
        if gradient_predivide_factor != 1.0:
            refuse(f"{kind}(gradient_predivide_factor={gradient_predivide_factor})", "use 1.0")
        if backward_passes_per_step != 1:
            refuse(f"{kind}(backward_passes_per_step={backward_passes_per_step}) (local gradient accumulation)", "use 1")
        if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
            refuse(f"{kind}(process_set=...)", "gradients are averaged over all ranks")


def _reduce_op(op: Any, kind: str) -> ReduceOp:
    """Caramel's Average and Sum, or Horovod's (its op constants are small integers, or names)."""
    if isinstance(op, ReduceOp) and op in (Average, Sum):
        return op
    name = getattr(op, "name", None) or {0: "average", 1: "sum", 2: "adasum", 3: "min", 4: "max", 5: "product"}.get(op, str(op))
    if str(name).lower() in ("average", "sum"):
        return ReduceOp(str(name).lower())
    refuse(f"{kind}(op={name})", "gradients are averaged (Average) or summed (Sum)")


class DistributedGradientTape:
    """Wraps a tf.GradientTape so that gradient() returns gradients averaged over all ranks.

    Takes Horovod's keywords (`compression`, `op`, `sparse_as_dense`, ...); those Caramel does not
    support fail here, naming the keyword."""

    def __init__(self, tape: tf.GradientTape, **horovod_options: Any) -> None:
        self._tape = tape
        self._options = _HorovodOptions("DistributedGradientTape", **horovod_options)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        gradients = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        return tf.nest.pack_sequence_as(gradients, allreduce_gradients(flat, self._options.op, self._options.compression))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def DistributedOptimizer(optimizer: tf.keras.optimizers.Optimizer, **horovod_options: Any) -> tf.keras.optimizers.Optimizer:  # noqa: N802 (Horovod's name)
    """The same Keras optimizer, whose updates first average the gradients over all ranks.

    It is an instance of a subclass of the optimizer's own class, as Horovod's is, so that
    `model.compile` and checkpoints take it as the optimizer it wraps; it starts from the given
    optimizer's configuration. Its gradients are averaged where the Keras that `tf.keras` is
    applies them (`caramel.tensorflow.keras_version.updating_through`: Keras 3's `apply`, Keras
    2's `apply_gradients`). Takes Horovod's keywords.
    """
    check_optimizer(optimizer, "DistributedOptimizer")
    base = type(optimizer)
    if getattr(base, "_caramel_distributed", False):
        return optimizer
    options = _HorovodOptions("DistributedOptimizer", **horovod_options)

    def averaged(self: Any, gradients: list[Any], variables: Sequence[Any]) -> list[Any]:
        return allreduce_gradients(gradients, options.op, options.compression)

    return updating_through(base, averaged, _caramel_distributed=True).from_config(optimizer.get_config())


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Overwrite variables on every rank with rank root_rank's values."""
    _broadcast_variables(current(), list(variables), root_rank)
