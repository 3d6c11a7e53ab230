"""Horovod's TensorFlow 2 API as Caramel serves it, which `horovod.tensorflow` (the package's
`__init__`) gathers with the names of the modules beside this one.

    hvd.init()                                   # joins the job's ranks: caramel.tensorflow.runtime.init
    tape = hvd.DistributedGradientTape(tape)     # caramel.tensorflow.DistributedGradientTape
    opt = hvd.DistributedOptimizer(opt)          # caramel.tensorflow.DistributedOptimizer
    hvd.broadcast_variables(model.variables, root_rank=0)

Everything runs on Caramel's runtime: `spec.caramel.backend: auto` picks Horovod's collectives
where Horovod is installed (its C++ ops, the real Horovod's `horovod.tensorflow.mpi_ops`) and
TensorFlow's own otherwise. The tape and the optimizer take Horovod's keywords
(`caramel.tensorflow.horovod_options`); gradients are averaged as Caramel averages them (see
`caramel.tensorflow.communicator`). `allreduce`, `allgather` (first dimensions may differ from
rank to rank), `broadcast` and their grouped forms work eagerly and in graphs; `broadcast_object`
and `allgather_object` eagerly. At exit every rank's trained weights are compared
(`_caramel_final_check`).

The tape takes local sources (`register_local_source`, `PartialDistributedGradientTape`), whose
gradients each rank keeps; the optimizer accumulates `backward_passes_per_step` passes per update
(`caramel.tensorflow.accumulation`) and serves Keras 2's `_compute_gradients` (its gradients
reduced, as Horovod's are), and wraps Keras 2's legacy optimizers too; `SyncBatchNormalization` averages batch statistics over the ranks;
`broadcast_global_variables` takes TensorFlow 1's call in TensorFlow 2's meaning (every variable of
the process: `functions.py`).

What only Horovod's core has (alltoall, reducescatter, join, process sets, Adasum and Product) is
passed through to Horovod's own ops where the job runs on them, and refused by name elsewhere
(`_caramel_horovod_ops`). Elastic training (`hvd.elastic`) re-forms the ranks in the process on the
horovod backend (`elastic.py`). The rest of Horovod's API fails when called, naming the feature
(`NotSupportedByCaramel`): the timeline and TF1's sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.collectives.backend import ReduceOp, chosen, horovod_installed
from caramel.contract.api import Backend as BackendChoice
from caramel.launch import elastic_rounds
from caramel.tensorflow import runtime as _caramel_runtime
from caramel.tensorflow.horovod_options import horovod_signature
from caramel.tensorflow.keras_version import check_optimizer, updating_through
from horovod import _caramel_keras2_idioms
from horovod._caramel_support import refuse, unsupported
from horovod.tensorflow import _caramel_final_check
from horovod.tensorflow import _caramel_horovod_ops as horovod_ops
from horovod.tensorflow._caramel_collectives import (
    HorovodOp,
    backend,
    check_root,
    collective_name,
    gather_ragged,
    global_process_set,
    is_global,
    reduce_op,
)
from horovod.tensorflow.compression import Compression

Average, Sum = ctf.Average, ctf.Sum
Min, Max = ReduceOp.MIN, ReduceOp.MAX

_SHUT_DOWN = False


# -- set-up and the job's shape ------------------------------------------------------------------


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job's ranks (Caramel's runtime), accept the Keras 2 idioms of Horovod-era scripts,
    and check the trained weights at exit."""
    if comm is not None:
        refuse("hvd.init(comm=...)", "the CaramelJob's gang is the communicator; call hvd.init()")
    _caramel_keras2_idioms.install()
    elastic_rounds.join_when_ready(on_horovod=lambda contract: chosen(contract) is BackendChoice.HOROVOD)
    if process_sets:
        horovod_ops.start_with(process_sets)
    _caramel_runtime.init()
    _caramel_final_check.arm()


def shutdown() -> None:
    """Horovod's shutdown: the trained weights are checked now (every rank must call it)."""
    global _SHUT_DOWN
    _caramel_final_check.check()
    _SHUT_DOWN = True


def is_initialized() -> bool:
    try:
        _caramel_runtime.current()
    except RuntimeError:
        return False
    return not _SHUT_DOWN


def size() -> int:
    return _caramel_runtime.current().size


def rank() -> int:
    return _caramel_runtime.current().rank


def local_size() -> int:
    return backend().local_size


def local_rank() -> int:
    return backend().local_rank


def cross_size() -> int:
    """The number of workers (Horovod's hosts): every worker runs local_size ranks."""
    return size() // local_size()


def cross_rank() -> int:
    """This rank's worker (Horovod's host), rank r running on worker r // local_size."""
    return rank() // local_size()


def is_homogeneous() -> bool:
    return True  # every worker runs spec.workers.slotsPerWorker ranks


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    if process_set_id != 0:
        return horovod_ops.size_op(process_set_id, name)
    return tf.constant(size(), tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(rank(), tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(local_size(), tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(local_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    if process_set_id != 0:
        return horovod_ops.process_set_included_op(process_set_id, name)
    return tf.constant(1, tf.int32, name=name)


def _executing_eagerly() -> bool:
    """Horovod's helper (from its util), which its tests and some scripts call as hvd._executing_eagerly."""
    return tf.executing_eagerly()


def gloo_enabled() -> bool:
    return backend().name == "horovod"


def _false() -> bool:
    return False


def _as_horovod_built(feature: str) -> Callable[[], bool | int]:
    """Horovod's own answer to whether it was built with `feature` (hvd.nccl_built() is NCCL's
    version code, 0 without it: the GPU image's Horovod has NCCL), where Horovod is installed;
    False where it is not. Its library loads on the first call, not before."""

    def built() -> bool | int:
        if not horovod_installed():
            return False
        from caramel.collectives.horovod_backend import mpi_ops

        return getattr(mpi_ops, f"{feature}_built")()

    built.__name__ = f"{feature}_built"
    return built


gloo_built, mpi_built, nccl_built, cuda_built, rocm_built, ddl_built, ccl_built = (
    _as_horovod_built(feature) for feature in ("gloo", "mpi", "nccl", "cuda", "rocm", "ddl", "ccl")
)
# MPI is never the controller of a Caramel gang; Horovod 0.28.1 has no SYCL build.
mpi_enabled = mpi_threads_supported = sycl_built = _false


# -- collectives ---------------------------------------------------------------------------------


def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """`tensor` reduced over all ranks (Average by default; Sum, Min, Max; and Adasum or Product,
    and any process set but the global one, by Horovod's op: `_caramel_horovod_ops`). A
    tf.IndexedSlices is gathered, as Horovod does: its values and indices from every rank."""
    del device_dense, device_sparse, ignore_name_scope
    reduction = reduce_op(average, op, "hvd.allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse_op(reduction, "hvd.allreduce")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")  # Horovod's own error
        base = collective_name("allreduce", name)
        values = _gathered([tensor.values], f"{base}_values", process_set)[0]
        indices = _gathered([tensor.indices], f"{base}_indices", process_set)[0]
        if reduction is ReduceOp.AVERAGE:  # Horovod's division, which gives integer values a float dtype
            values = values / tf.cast(size() if is_global(process_set) else process_set.size(), values.dtype)
        return tf.IndexedSlices(values, indices, tensor.dense_shape)
    if isinstance(reduction, HorovodOp) or not is_global(process_set):
        return horovod_ops.allreduce([tensor], reduction, process_set, compression, prescale_factor, postscale_factor, name)[0]
    return _reduced([tensor], reduction, compression, prescale_factor, postscale_factor, collective_name("allreduce", name))[0]


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
    name: str | None = None,
) -> list[tf.Tensor]:
    """Every tensor reduced over all ranks, in one collective per dtype (Horovod's arguments, in
    Horovod's order, which differs from allreduce's); as allreduce, by Horovod's op for Adasum,
    Product and process sets."""
    del device_dense, device_sparse, ignore_name_scope
    reduction = reduce_op(average, op, "hvd.grouped_allreduce")
    sparse = [i for i, tensor in enumerate(tensors) if isinstance(tensor, tf.IndexedSlices)]
    if sparse:  # each gathered, as allreduce gathers one; the dense ones grouped
        _check_sparse_op(reduction, "hvd.grouped_allreduce")
        base = collective_name("allreduce", name)
        dense = [i for i in range(len(tensors)) if i not in sparse]
        results = dict(zip(dense, grouped_allreduce([tensors[i] for i in dense], None, "", "", compression, reduction, prescale_factor,
                                                    postscale_factor, process_set, False, f"{base}_dense")))  # fmt: skip
        for i in sparse:
            results[i] = allreduce(tensors[i], op=reduction, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                   name=f"{base}_{i}", process_set=process_set)  # fmt: skip
        return [results[i] for i in range(len(tensors))]
    if not tensors:
        return []
    if isinstance(reduction, HorovodOp) or not is_global(process_set):
        return horovod_ops.allreduce(tensors, reduction, process_set, compression, prescale_factor, postscale_factor, name)
    return _reduced(tensors, reduction, compression, prescale_factor, postscale_factor, collective_name("allreduce", name))


def _check_sparse_op(reduction: ReduceOp | HorovodOp, feature: str) -> None:
    if reduction not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        refuse(f"{feature}(op={reduction.name.title()}) of a tf.IndexedSlices", "sparse tensors are averaged or summed")


def _reduced(tensors: Sequence[Any], reduction: ReduceOp, compression: Any, prescale: float, postscale: float, name: str) -> list[tf.Tensor]:
    compressed = [compression.compress(_scaled(tf.convert_to_tensor(tensor), prescale)) for tensor in tensors]
    reduced = backend().all_reduce([tensor for tensor, _ in compressed], reduction, name)
    return [_scaled(compression.decompress(tensor, context), postscale) for tensor, (_, context) in zip(reduced, compressed)]


def _scaled(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """`tensor` times `factor` as Horovod's core scales: integers in float64, float16 in float32."""
    if factor == 1.0:
        return tensor
    exact = tf.float64 if tensor.dtype.is_integer else tf.float32 if tensor.dtype == tf.float16 else tensor.dtype
    return tf.cast(tf.cast(tensor, exact) * tf.cast(factor, exact), tensor.dtype)


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = global_process_set) -> tf.Tensor:
    """Every rank's `tensor` joined along the first axis, in rank order; first dimensions may
    differ from rank to rank, the other dimensions may not. Over a process set, its ranks' (Horovod's op)."""
    del ignore_name_scope
    return _gathered([tensor], collective_name("allgather", name), process_set)[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False, process_set: Any = global_process_set) -> list[tf.Tensor]:
    return _gathered(tensors, collective_name("allgather", name), process_set)


def _gathered(tensors: Sequence[Any], name: str, process_set: Any) -> list[tf.Tensor]:
    if not is_global(process_set):
        return horovod_ops.allgather(tensors, process_set, name)
    if len(tensors) == 1:
        return [gather_ragged(tensors[0], name)[0]]
    return [gather_ragged(tensor, f"{name}_{i}")[0] for i, tensor in enumerate(tensors)]


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = global_process_set) -> tf.Tensor:
    """Rank root_rank's `tensor` (of one shape on every rank), on every rank (of the process set:
    Horovod's op; root_rank is a global rank, as in Horovod)."""
    del ignore_name_scope
    check_root(root_rank, "hvd.broadcast")
    return _broadcast([tensor], root_rank, collective_name("broadcast", name), process_set)[0]


def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Horovod's in-place broadcast: the variables take rank root_rank's values, which it returns
    (read after the assignment, so that in a graph running them assigns)."""
    check_root(root_rank, "hvd.broadcast_")
    variables = list(variables)
    values = _broadcast(variables, root_rank, collective_name("broadcast", name), process_set)
    return [variable.assign(value) for variable, value in zip(variables, values)]


def _broadcast(tensors: Sequence[Any], root_rank: int, name: str, process_set: Any) -> list[tf.Tensor]:
    if not is_global(process_set):
        return [horovod_ops.broadcast(tensor, root_rank, process_set, f"{name}_{i}") for i, tensor in enumerate(tensors)]
    return backend().broadcast([tf.convert_to_tensor(tensor) for tensor in tensors], root_rank, name)


# -- training ------------------------------------------------------------------------------------


class _DistributedGradientTape(ctf.DistributedGradientTape):
    """Caramel's tape, which also notes the variables it averages, for the weights check at exit."""

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False, **kwargs: Any) -> Any:
        _caramel_final_check.note_trained([source for source in tf.nest.flatten(sources) if not self.is_local_source(source)])
        return super().gradient(target, sources, output_gradients, use_generic_names, **kwargs)


# Horovod's tape and optimizer take Horovod's options (caramel.tensorflow.horovod_options) in
# Horovod's order of each; Horovod's default process set is its global one.
_TAPE_OPTIONS = (
    "device_dense", "device_sparse", "compression", "sparse_as_dense", "op", "gradient_predivide_factor", "num_groups", "groups",
    "process_set",
)  # fmt: skip


@horovod_signature("gradtape", *_TAPE_OPTIONS, "scale_local_gradients", process_set=global_process_set)
def DistributedGradientTape(gradtape: tf.GradientTape, **horovod_options: Any) -> _DistributedGradientTape:  # noqa: N802 (Horovod's name)
    """The tape, whose gradient() averages (op Sum: sums) the gradients over all ranks."""
    return _DistributedGradientTape(gradtape, **horovod_options)


@horovod_signature("gradtape", *_TAPE_OPTIONS, "local_layers", "scale_local_gradients", process_set=global_process_set, local_layers=None)
def PartialDistributedGradientTape(gradtape: tf.GradientTape, local_layers: Any, **horovod_options: Any) -> _DistributedGradientTape:  # noqa: N802 (Horovod's name)
    """The tape of DistributedGradientTape, whose gradients of the local layers' trainable
    weights each rank keeps to itself (their sources registered local)."""
    tape = _DistributedGradientTape(gradtape, **horovod_options)
    for variable in local_layer_variables(local_layers):
        tape.register_local_source(variable)
    return tape


def local_layer_variables(local_layers: Any) -> list[Any]:
    """The trainable weights of Horovod's `local_layers` (a Keras layer, a list of them, or None)."""
    if local_layers is None:
        return []
    layers = [local_layers] if isinstance(local_layers, tf.keras.layers.Layer) else list(local_layers)
    if not all(isinstance(layer, tf.keras.layers.Layer) for layer in layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")  # Horovod's own error
    return [variable for layer in layers for variable in layer.trainable_weights]


@horovod_signature(
    "optimizer", "name", "use_locking", "device_dense", "device_sparse", "compression", "sparse_as_dense", "backward_passes_per_step",
    "op", "gradient_predivide_factor", "average_aggregated_gradients", "num_groups", "groups", "process_set", "scale_local_gradients",
    use_locking=False, process_set=global_process_set,
)  # fmt: skip
def DistributedOptimizer(optimizer: Any, use_locking: bool, **horovod_options: Any) -> Any:  # noqa: N802 (Horovod's name)
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first."""
    del use_locking  # TensorFlow 1's
    return distributed_optimizer(optimizer, **horovod_options)


def distributed_optimizer(optimizer: Any, local_variables: Sequence[Any] = (), **horovod_options: Any) -> Any:
    """Caramel's DistributedOptimizer around a copy of `optimizer` that notes the variables it
    updates (for the weights check at exit); horovod.tensorflow.keras's DistributedOptimizer too.
    `local_variables`: those each rank keeps to itself (PartialDistributedOptimizer's)."""
    check_optimizer(optimizer, "hvd.DistributedOptimizer")
    if getattr(type(optimizer), "_caramel_distributed", False):
        return optimizer
    noting = _noting_class(type(optimizer))
    return ctf.DistributedOptimizer(noting.from_config(optimizer.get_config()), local_variables, **horovod_options)


def distribute(optimizer: Any, **horovod_options: Any) -> None:
    """Make `optimizer` itself Horovod's DistributedOptimizer as Caramel serves it, keeping its
    state (a loaded model's: `hvd.load_model`)."""
    check_optimizer(optimizer, "hvd.DistributedOptimizer")
    if not getattr(type(optimizer), "_caramel_distributed", False):
        optimizer.__class__ = _noting_class(type(optimizer))  # the update method alone differs: no state to add
        ctf.distribute(optimizer, **horovod_options)


def _noting_class(base: type[Any]) -> type[Any]:
    """`base`, noting the variables its updates train."""

    def noted(self: Any, gradients: list[Any], variables: Sequence[Any], apply: Callable[[list[Any]], Any]) -> Any:
        _caramel_final_check.note_trained(variables)
        return apply(gradients)

    return updating_through(base, noted)


# -- what Caramel does not serve -----------------------------------------------------------------

start_timeline = unsupported("hvd.start_timeline", "Caramel records each step's transfers in its own metrics")
stop_timeline = unsupported("hvd.stop_timeline", "Caramel records each step's transfers in its own metrics")
