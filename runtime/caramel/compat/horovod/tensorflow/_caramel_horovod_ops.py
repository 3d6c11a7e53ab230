"""Horovod's features that only Horovod's core has, passed through to its own ops
(`horovod.tensorflow.mpi_ops`, the real Horovod's C++ ops) where the job runs on the horovod
backend: alltoall, reducescatter and its grouped form, join, process sets (`hvd.init(process_sets=...)`,
`add_process_set`, `remove_process_set`, and any collective or size op over a set other than the
global one), and the reductions Adasum and Product. Caramel's own allreduce, allgather and
broadcast stay Caramel's for the global set.

On the tensorflow backend (and without Horovod) each is refused by name: TensorFlow's collectives
have no such ops, and a process set would need a group of its own in TensorFlow's collective
executor.

A process set is of one set of ranks, registered with Horovod's core as it starts (or later, with
HOROVOD_DYNAMIC_PROCESS_SETS: `hvd.init(process_sets="dynamic")`); an elastic gang's ranks
re-form, so process sets are refused there (`hvd.elastic.run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import tensorflow as tf

from caramel.collectives.backend import ReduceOp, chosen, horovod_installed
from caramel.contract.api import Backend as BackendChoice
from caramel.contract.env import WorkerContract
from caramel.tensorflow.runtime import current
from horovod._caramel_support import refuse, unsupported
from horovod.tensorflow._caramel_collectives import HorovodOp, is_global, reduce_op
from horovod.tensorflow.compression import Compression

ON_HOROVOD = (
    "Caramel passes it through to Horovod's own ops where the job runs on Horovod's collectives "
    "(Horovod installed, spec.caramel.backend auto or horovod), not on TensorFlow's"
)

if horovod_installed():
    from horovod.common.process_sets import ProcessSet
else:
    ProcessSet = unsupported("hvd.ProcessSet", f"{ON_HOROVOD}; Horovod is not installed here (use hvd.global_process_set)")

_registered: list[Any] = []
"""The process sets registered with Horovod's core, which an elastic gang cannot keep."""


def mpi_ops(feature: str, instead: str) -> ModuleType:
    """Horovod's ops, where the job runs on the horovod backend; refused, naming `feature`, on any
    other (`instead`: what to use there)."""
    if current().backend.name != "horovod":
        refuse(feature, f"{ON_HOROVOD}; {instead}")
    from caramel.collectives.horovod_backend import mpi_ops as ops

    return ops


def registered() -> list[Any]:
    return list(_registered)


def start_with(process_sets: Any) -> None:
    """Start Horovod's core with the process sets (or "dynamic"), before Caramel's runtime joins
    the ranks: Horovod registers process sets as it starts, and its later init (the horovod
    backend's) is then a no-op that joins the same ranks."""
    if chosen(WorkerContract.from_env()) is not BackendChoice.HOROVOD:
        refuse("hvd.init(process_sets=...)", f"{ON_HOROVOD}; collectives here are among all ranks (hvd.global_process_set)")
    from caramel.collectives import horovod_backend

    horovod_backend.start(process_sets)
    if not isinstance(process_sets, str):
        _registered.extend(process_set for process_set in process_sets if process_set.process_set_id is not None)


def add_process_set(process_set: Any) -> Any:
    """Horovod's add_process_set (its core started with HOROVOD_DYNAMIC_PROCESS_SETS=1)."""
    mpi_ops("hvd.add_process_set", "collectives here are among all ranks (hvd.global_process_set)")
    from horovod.common import process_sets

    added = process_sets.add_process_set(process_set)
    _registered.append(added)
    return added


def remove_process_set(process_set: Any) -> bool:
    mpi_ops("hvd.remove_process_set", "collectives here are among all ranks (hvd.global_process_set)")
    from horovod.common import process_sets

    if process_set in _registered:
        _registered.remove(process_set)
    return process_sets.remove_process_set(process_set)


def horovod_op(ops: ModuleType, op: ReduceOp | HorovodOp) -> Any:
    """Caramel's reduction (or Adasum, Product) as Horovod's op."""
    return getattr(ops, op.name.title())


def allreduce(tensors: Sequence[Any], op: ReduceOp | HorovodOp, process_set: Any, compression: Any, prescale: float, postscale: float, name: str | None) -> list[tf.Tensor]:
    """The tensors reduced by Horovod's allreduce (grouped, for more than one) over the process set."""
    feature = f"hvd.allreduce(op={op.name.title()})" if is_global(process_set) else "hvd.allreduce(process_set=...)"
    ops = mpi_ops(feature, "tensors are reduced by Average, Sum, Min or Max among all ranks")
    compressed = [compression.compress(tf.convert_to_tensor(tensor)) for tensor in tensors]
    options = {"op": horovod_op(ops, op), "prescale_factor": prescale, "postscale_factor": postscale, "process_set": _horovods(ops, process_set)}
    if len(tensors) == 1:
        reduced = [ops._allreduce(compressed[0][0], name=name, **options)]
    else:
        reduced = list(ops._grouped_allreduce([tensor for tensor, _ in compressed], name=name, **options))
    return [compression.decompress(tensor, context) for tensor, (_, context) in zip(reduced, compressed)]


def allgather(tensors: Sequence[Any], process_set: Any, name: str | None) -> list[tf.Tensor]:
    ops = mpi_ops("hvd.allgather(process_set=...)", "tensors are gathered from all ranks (hvd.global_process_set)")
    if len(tensors) == 1:
        return [ops.allgather(tensors[0], name=name, process_set=process_set)]
    return list(ops.grouped_allgather(list(tensors), name=name, process_set=process_set))


def broadcast(tensor: Any, root_rank: int, process_set: Any, name: str | None) -> tf.Tensor:
    ops = mpi_ops("hvd.broadcast(process_set=...)", "tensors are broadcast to all ranks (hvd.global_process_set)")
    return ops.broadcast(tensor, root_rank, name=name, process_set=process_set)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Horovod's alltoall: slices of `tensor` along its first axis (`splits`: how many to each
    rank; equal shares without) sent to every rank, and what every rank sent this one."""
    ops = mpi_ops("hvd.alltoall", "its collectives are allreduce, allgather and broadcast")
    return ops.alltoall(tensor, splits, name=name, ignore_name_scope=ignore_name_scope, process_set=_horovods(ops, process_set))


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    name: str | None = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Horovod's reducescatter: `tensor` reduced over the ranks (Average by default, or Sum), each
    rank keeping its share along the first axis."""
    del device_dense
    ops = mpi_ops("hvd.reducescatter", "reduce with hvd.allreduce")
    compressed, context = compression.compress(tf.convert_to_tensor(tensor))
    reduced = ops._reducescatter(compressed, name=name, ignore_name_scope=ignore_name_scope,
                                 **_scatter_options(ops, op, process_set, prescale_factor, postscale_factor, "hvd.reducescatter"))  # fmt: skip
    return compression.decompress(reduced, context)


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """reducescatter of every tensor, as one of Horovod's grouped ops."""
    del device_dense
    ops = mpi_ops("hvd.grouped_reducescatter", "reduce with hvd.grouped_allreduce")
    if not tensors:
        return list(tensors)
    compressed = [compression.compress(tf.convert_to_tensor(tensor)) for tensor in tensors]
    options = _scatter_options(ops, op, process_set, prescale_factor, postscale_factor, "hvd.grouped_reducescatter")
    reduced = ops._grouped_reducescatter([tensor for tensor, _ in compressed], **options)
    return [compression.decompress(tensor, context) for tensor, (_, context) in zip(reduced, compressed)]


def _scatter_options(ops: ModuleType, op: Any, process_set: Any, prescale: float, postscale: float, feature: str) -> dict[str, Any]:
    """The keywords of Horovod's reducescatter ops: Horovod's op (Average by default) and set."""
    return {"op": horovod_op(ops, reduce_op(None, op, feature)), "process_set": _horovods(ops, process_set),
            "prescale_factor": prescale, "postscale_factor": postscale}  # fmt: skip


def join() -> tf.Tensor:
    """Horovod's join: this rank is done; the others' allreduces go on without it (it adds zeros)
    until every rank joined. The last rank that joined."""
    return mpi_ops("hvd.join", "every rank must run the same number of steps").join()


def size_op(process_set_id: int, name: str | None) -> tf.Tensor:
    return mpi_ops(f"hvd.size_op(process_set_id={process_set_id})", "its collectives are among all ranks (process set 0)").size_op(process_set_id, name)


def process_set_included_op(process_set_id: int, name: str | None) -> tf.Tensor:
    ops = mpi_ops(f"hvd.process_set_included_op(process_set_id={process_set_id})", "its collectives are among all ranks (process set 0)")
    return ops.process_set_included_op(process_set_id, name)


def _horovods(ops: ModuleType, process_set: Any) -> Any:
    """The process set as Horovod's ops take it: Horovod's own global set for Caramel's."""
    return ops.global_process_set if is_global(process_set) else process_set
