"""Horovod's collectives on Caramel's backend: what `horovod.tensorflow`'s functions share.

Caramel's backends reduce, broadcast and gather tensors of one shape on every rank, eagerly and in
graphs (`caramel.collectives.backend`). Horovod's allgather also takes tensors whose first
dimension differs from rank to rank: the ranks first gather each other's first dimensions, pad to
the longest, gather, and cut the padding out. Gathers and broadcasts are sums to which one rank
contributes, so tensors of dtypes that collectives may not sum travel in one that sums them exactly.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from caramel.collectives.backend import SUMMED_AS, Backend, ReduceOp
from caramel.tensorflow.runtime import current
from horovod._caramel_support import refuse


class HorovodOp:
    """One of Horovod's reductions that only Horovod's core has (Adasum, Product): passed through
    to Horovod's ops where the job runs on them (`_caramel_horovod_ops`), refused elsewhere."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


Adasum, Product = HorovodOp("Adasum"), HorovodOp("Product")
HOROVODS_OPS: dict[int, ReduceOp | HorovodOp] = {0: ReduceOp.AVERAGE, 1: ReduceOp.SUM, 2: Adasum, 3: ReduceOp.MIN, 4: ReduceOp.MAX, 5: Product}
"""Horovod's reductions by their values in Horovod's core (a script may pass mpi_ops' numbers)."""


class GlobalProcessSet:
    """Horovod's `global_process_set`, every rank, whose collectives are Caramel's own (any other
    set's are Horovod's: `_caramel_horovod_ops`)."""

    process_set_id = 0

    def size(self) -> int:
        return current().size

    def rank(self) -> int:
        return current().rank

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, ranks=all)"


global_process_set = GlobalProcessSet()


def backend() -> Backend:
    return current().backend


def is_global(process_set: Any) -> bool:
    return process_set is None or getattr(process_set, "process_set_id", 0) == 0


def check_process_set(process_set: Any, feature: str) -> None:
    """Refuse a process set other than the global one, for what runs among all ranks only."""
    if not is_global(process_set):
        refuse(f"{feature}(process_set=...)", "it runs among all ranks (hvd.global_process_set); over a process set, "
               "use hvd.allreduce, hvd.allgather, hvd.broadcast, hvd.alltoall or hvd.reducescatter")  # fmt: skip


def check_root(root_rank: int, feature: str) -> None:
    size = current().size
    if not 0 <= root_rank < size:
        raise ValueError(f"{feature}: root_rank {root_rank} is not a rank of this job (0 to {size - 1})")


def reduce_op(average: bool | None, op: Any, feature: str) -> ReduceOp | HorovodOp:
    """Horovod's `op` (or its deprecated `average`) as Caramel's ReduceOp, or Horovod's own."""
    if average is not None and op is not None:
        raise ValueError(f"{feature}: give op or average (deprecated), not both")
    if op is None:
        return ReduceOp.AVERAGE if average is None or average else ReduceOp.SUM
    if isinstance(op, (ReduceOp, HorovodOp)):
        return op
    if op in HOROVODS_OPS:
        return HOROVODS_OPS[op]
    refuse(f"{feature}(op={op!r})", "tensors are reduced by Average, Sum, Min, Max, Adasum or Product")


def collective_name(kind: str, name: str | None) -> str:
    """A collective's name, the same on every rank: a graph makes its ops' names unique itself,
    and eager collectives run one at a time."""
    return f"hvd_{kind}" if name is None else f"hvd_{kind}_{re.sub(r'[^A-Za-z0-9_.-]', '_', str(name))}"


def summable(tensor: tf.Tensor) -> tf.Tensor:
    return tf.cast(tensor, SUMMED_AS.get(tensor.dtype, tensor.dtype))


def gather_ragged(tensor: Any, name: str) -> tuple[tf.Tensor, tf.Tensor]:
    """Every rank's `tensor` joined along the first axis in rank order (their first dimensions may
    differ, the others not), and each rank's first dimension (int64). Its gradient is Horovod's
    allgather's: the upstream gradient averaged over the ranks, this rank's rows of it."""
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("hvd.allgather gathers tensors along their first dimension: give a tensor of at least one dimension, not a scalar")
    collectives = backend()
    # Through a placeholder, which TensorFlow's shape inference does not evaluate through: in a
    # TensorFlow 1 graph it would otherwise run the gather of the sizes (its input's shape being
    # known) on this rank alone as the padding is built, waiting forever for the others.
    rows = tf.compat.v1.placeholder_with_default(tf.shape(tensor, out_type=tf.int64)[:1], [1])
    sizes = tf.reshape(collectives.all_gather(rows, name=f"{name}_sizes"), [-1])

    @tf.custom_gradient
    def joined(tensor: tf.Tensor) -> Any:
        # At least one row: a gather of nothing at all is no tensor the backends can scatter.
        padding = tf.concat([tf.reshape(tf.maximum(tf.reduce_max(sizes), 1) - rows, [1, 1]), tf.zeros([tensor.shape.rank - 1, 1], tf.int64)], axis=0)
        padded = tf.pad(summable(tensor), tf.concat([tf.zeros_like(padding), padding], axis=1))
        gathered = collectives.all_gather(padded, name=name)  # [ranks, longest, ...]
        mine = tf.boolean_mask(gathered, tf.sequence_mask(sizes, tf.shape(gathered, out_type=tf.int64)[1]))

        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            averaged = collectives.all_reduce([upstream], ReduceOp.AVERAGE, f"{name}_gradient")[0]
            start = tf.reduce_sum(sizes[: collectives.rank])
            return averaged[start : start + sizes[collectives.rank]]

        return tf.cast(mine, tensor.dtype), gradient

    return joined(tensor), sizes
