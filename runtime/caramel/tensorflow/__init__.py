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

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from caramel.collectives.backend import ReduceOp
from caramel.tensorflow.accumulation import Accumulation, accumulation
from caramel.tensorflow.autograph_exemption import exempt_caramel_from_autograph
from caramel.tensorflow.compression import Compression, Compressor
from caramel.tensorflow.horovod_options import HorovodOptions
from caramel.tensorflow.keras_version import check_optimizer, updating_through
from caramel.tensorflow.ledger import broadcast_variables as _broadcast_variables
from caramel.tensorflow.runtime import Runtime, current
from caramel.tensorflow.runtime import init as _init
from caramel.tensorflow.steps import StepFunction, function
from caramel.tensorflow.unsupported import NotSupportedByCaramel

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
    "distribute",
    "function",
    "init",
    "local_rank",
    "local_size",
    "rank",
    "size",
]

# Before any step is traced: a step reaches Caramel's code through this package only (the horovod
# package Caramel serves imports it).
exempt_caramel_from_autograph()

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


class _GradientAveraging:
    """How a tape's or an optimizer's gradients are averaged over the ranks, by Horovod's options
    (`HorovodOptions`): its local sources, and its local accumulation."""

    def __init__(self, kind: str, **horovod_options: Any) -> None:
        options = HorovodOptions.checked(kind, **horovod_options)
        self.op: ReduceOp = options.op
        self.compression = options.compression
        self.scale_local_gradients = options.scale_local_gradients
        self.local_sources: dict[int, Any] = {}
        """Horovod's local sources, by id: variables whose gradients each rank keeps to itself."""
        self.passes = options.backward_passes_per_step
        self.average_aggregated_gradients = options.average_aggregated_gradients
        self._prepared: list[Any] = []
        """The gradients Keras 2's compute_gradients returned last, reduced already: the update
        that applies them next does not reduce them again."""

    def add_local(self, source: Any) -> None:
        """A variable each rank trains on its own gradient (Horovod's local source). The runtime
        knows it too, so that the check that every rank ends with the same weights leaves it out."""
        self.local_sources[id(source)] = source
        current().local_variables[id(source)] = source

    def reduced(self, gradients: Sequence[Any], sources: Sequence[Any]) -> list[Any]:
        """The gradients of `sources` averaged (op Sum: summed) over all ranks, those of local
        sources excepted: each rank's own, divided by the number of ranks where
        scale_local_gradients (as Horovod does, so that a local layer learns at the rate the
        averaged ones do)."""
        shared = [index for index, source in enumerate(sources) if id(source) not in self.local_sources]
        result = list(gradients)
        for index, gradient in zip(shared, allreduce_gradients([gradients[index] for index in shared], self.op, self.compression)):
            result[index] = gradient
        if self.scale_local_gradients:
            for index, source in enumerate(sources):
                if id(source) in self.local_sources and gradients[index] is not None:
                    result[index] = _divided(gradients[index], current().size)
        return result

    def prepared(self, optimizer: Any, gradients: list[Any], variables: Sequence[Any]) -> list[Any]:
        """What an optimizer's update applies: the gradients reduced over the ranks; with local
        accumulation, the sums of the passes, reduced on the pass that completes them (see
        accumulation.py)."""
        if self.passes == 1:
            self._prepared = self.reduced(gradients, variables)
        else:
            self._prepared = self._accumulation(optimizer).communicated(gradients, variables, self._reduced_now_and_then)
        return self._prepared

    def _reduced_now_and_then(self, gradients: Sequence[Any], sources: Sequence[Any]) -> list[Any]:
        with current().communicator.now_and_then():
            return self.reduced(gradients, sources)

    def update(self, optimizer: Any, gradients: list[Any], variables: Sequence[Any], apply: Callable[[list[Any]], Any]) -> Any:
        """An optimizer's update: the gradients prepared (unless they are those compute_gradients
        returned, prepared already) and applied; with local accumulation, applied only on the pass
        that communicated."""
        fresh = not self._prepared or len(gradients) != len(self._prepared) or any(a is not b for a, b in zip(gradients, self._prepared))
        prepared = self.prepared(optimizer, gradients, variables) if fresh else gradients
        self._prepared = []
        if self.passes == 1:
            return apply(prepared)
        self._accumulation(optimizer).applied(lambda: apply(prepared), optimizer.iterations)
        return optimizer.iterations

    def build(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """With local accumulation, the accumulators of `variables`, made with the optimizer's
        state (outside any trace, where the optimizer is built before its steps)."""
        if self.passes != 1:
            self._accumulation(optimizer).build(variables)

    def _accumulation(self, optimizer: Any) -> Accumulation:
        return accumulation(optimizer, self.passes, self.average_aggregated_gradients)


def _divided(gradient: Any, ranks: int) -> Any:
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / ranks, gradient.indices, gradient.dense_shape)
    return gradient / ranks


class DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape whose gradient() returns gradients averaged over all ranks.

    `DistributedGradientTape(tape)` is, as Horovod's, a tape of the wrapped tape's own class
    (`isinstance` takes it for one) that shares what the wrapped tape recorded: wrap a tape after
    its `with` block, or wrap a new one and record with the result. Takes Horovod's keywords
    (`compression`, `op`, `sparse_as_dense`, ...); those Caramel does not support fail here,
    naming the keyword. `register_local_source(variable)` keeps a variable's gradient each rank's
    own (Horovod's local sources)."""

    def __new__(cls, tape: tf.GradientTape, **horovod_options: Any) -> DistributedGradientTape:
        return super().__new__(_of_tape_class(cls, type(tape)))  # type: ignore[arg-type]  # classes hash; the untyped tf base hides it

    def __init__(self, tape: tf.GradientTape, **horovod_options: Any) -> None:
        super().__init__(persistent=tape._persistent, watch_accessed_variables=tape._watch_accessed_variables)
        self._tape = tape._tape  # what the wrapped tape recorded; None for a tape not entered yet
        self._averaging = _GradientAveraging("DistributedGradientTape", **horovod_options)

    def register_local_source(self, source: Any) -> None:
        """Keep `source`'s gradient each rank's own: it is not averaged over the ranks."""
        self._averaging.add_local(source)

    def is_local_source(self, source: Any) -> bool:
        """Whether `source`'s gradient is each rank's own (`register_local_source`)."""
        return id(source) in self._averaging.local_sources

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False, **kwargs: Any) -> Any:
        """The gradients of `target` with respect to `sources`, averaged over all ranks (local
        sources excepted). use_generic_names (Horovod's names for its collectives) changes
        nothing: Caramel names its transfers itself."""
        del use_generic_names
        gradients = super().gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        return tf.nest.pack_sequence_as(gradients, self._averaging.reduced(flat, tf.nest.flatten(sources, expand_composites=False)))

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False
    ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """Horovod's split of `gradient`: (source, gradient) pairs of the local sources, and of the others."""
        pairs = list(zip(sources, self.gradient(target, sources, output_gradients, use_generic_names)))
        local = [(source, gradient) for source, gradient in pairs if self.is_local_source(source)]
        return local, [(source, gradient) for source, gradient in pairs if not self.is_local_source(source)]


@functools.cache
def _of_tape_class(distributed: type, tape_class: type) -> type:
    """`distributed` (a DistributedGradientTape class) as a subclass of `tape_class` too."""
    if issubclass(distributed, tape_class):
        return distributed
    return type(tape_class.__name__, (distributed, tape_class), {"__module__": tape_class.__module__})


def DistributedOptimizer(  # noqa: N802 (Horovod's name)
    optimizer: tf.keras.optimizers.Optimizer, local_variables: Sequence[Any] = (), **horovod_options: Any
) -> tf.keras.optimizers.Optimizer:
    """The same Keras optimizer, whose updates first average the gradients over all ranks.

    It is an instance of a subclass of the optimizer's own class, as Horovod's is, so that
    `model.compile` and checkpoints take it as the optimizer it wraps; it starts from the given
    optimizer's configuration. Its gradients are averaged where the Keras that `tf.keras` is
    applies them (`caramel.tensorflow.keras_version.updating_through`: Keras 3's `apply`, Keras
    2's `apply_gradients`), but those of `local_variables`, which each rank keeps to itself (the
    variables of the local layers of Horovod's PartialDistributedOptimizer). Takes Horovod's keywords:
    with `backward_passes_per_step=N` it sums the gradients of N passes on each rank and updates
    once every N passes, with their sums averaged over the ranks (divided by N where
    `average_aggregated_gradients`), as Horovod does (accumulation.py). On Keras 2 its
    `compute_gradients` returns the gradients so prepared, as Horovod's does, and the update that
    applies them does not reduce them again.
    """
    check_optimizer(optimizer, "DistributedOptimizer")
    if getattr(type(optimizer), "_caramel_distributed", False):
        return optimizer
    return _distributed_class(optimizer, local_variables, horovod_options).from_config(optimizer.get_config())


def distribute(optimizer: tf.keras.optimizers.Optimizer, **horovod_options: Any) -> None:
    """Make `optimizer` itself Caramel's DistributedOptimizer, keeping its state: for an optimizer
    that holds state already (a loaded model's, whose slots and step count were restored)."""
    check_optimizer(optimizer, "DistributedOptimizer")
    if not getattr(type(optimizer), "_caramel_distributed", False):
        # The class differs from the optimizer's own by its update method alone: no state to add.
        optimizer.__class__ = _distributed_class(optimizer, (), horovod_options)


def _distributed_class(optimizer: Any, local_variables: Sequence[Any], horovod_options: dict[str, Any]) -> type[Any]:
    options = _GradientAveraging("DistributedOptimizer", **horovod_options)
    for variable in local_variables:
        options.add_local(variable)

    def register_local_var(self: Any, variable: Any) -> None:
        """Horovod's: keep `variable`'s gradient each rank's own (a local source)."""
        options.add_local(variable)

    return updating_through(
        type(optimizer), options.update, prepare=options.prepared, build=options.build, register_local_var=register_local_var,
        _caramel_distributed=True,
    )  # fmt: skip


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Overwrite variables on every rank with rank root_rank's values."""
    _broadcast_variables(current(), list(variables), root_rank)
