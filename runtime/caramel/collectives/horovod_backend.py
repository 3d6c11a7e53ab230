"""Horovod's collectives over Gloo, through its TensorFlow ops.

Only Horovod's ops are used (`horovod.tensorflow.mpi_ops`), not its Python training API, which
breaks on Keras 3 and which Caramel serves itself (`caramel.compat`). Horovod's ops are
asynchronous and not stateful: in a graph each one is handed to Horovod's background thread as
soon as its inputs exist, and Horovod fuses the requests that are ready together, negotiating
each by name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import tensorflow as tf

from caramel.collectives.backend import Backend, ReduceOp
from caramel.collectives.fusion import per_dtype
from caramel.collectives.horovod_installation import real_horovod_module
from caramel.contract.env import WorkerContract

# In a worker, `horovod` is Caramel's stand-in (caramel.compat), built on the runtime this backend
# is part of: Horovod's ops come from the real Horovod's directory instead, after the real
# Horovod's modules they import (the `horovod.common` package, `horovod.tensorflow.util`).
real_horovod_module("horovod.common")
real_horovod_module("horovod.tensorflow.util")
mpi_ops = real_horovod_module("horovod.tensorflow.mpi_ops")

OPS = {ReduceOp.SUM: mpi_ops.Sum, ReduceOp.AVERAGE: mpi_ops.Average, ReduceOp.MIN: mpi_ops.Min, ReduceOp.MAX: mpi_ops.Max}
# Horovod caches the negotiation of this many tensors (its default is 1024). A graph of several
# steps hands it each step's tensors under names of their own, and every step two ways to send
# them (Horovod's own and the plan's): an emulated NASNet-Mobile (742 parameter tensors) at four
# steps per graph names some 6,000. Beyond the cache, every tensor is negotiated in full, every
# step. A cache this size costs nothing while unused: Horovod's ranks agree on the entries in use.
RESPONSE_CACHE_CAPACITY = 16384
DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024
"""Horovod's fusion buffer where HOROVOD_FUSION_THRESHOLD is not set (0.28.1)."""


class HorovodBackend(Backend):
    name = "horovod"
    own_way_name = "Horovod's own way"
    reforms = True

    def all_reduce(self, tensors: Sequence[tf.Tensor], op: ReduceOp, name: str) -> list[tf.Tensor]:
        """One grouped allreduce per dtype: Horovod copies the tensors into its fusion buffer,
        which it allocates once, instead of a joined buffer of their size in every step, which
        raised the ranks' peak RSS above Horovod's own (figures: benchmarks/results/2026-11-27-figures-from-code-comments.txt)."""

        def grouped(group: list[tf.Tensor], group_name: str) -> list[tf.Tensor]:
            if len(group) == 1:
                return [mpi_ops._allreduce(group[0], name=group_name, op=OPS[op])]
            return list(mpi_ops._grouped_allreduce(group, name=group_name, op=OPS[op]))

        return per_dtype([tf.convert_to_tensor(tensor) for tensor in tensors], name, grouped)

    @property
    def own_way_fusion_bytes(self) -> int:
        return fusion_threshold_bytes(os.environ.get("HOROVOD_FUSION_THRESHOLD"))

    def own_way(self, gradients: Sequence[tf.Tensor], op: ReduceOp = ReduceOp.AVERAGE) -> list[tf.Tensor]:
        """Each gradient its own allreduce, as `hvd.DistributedGradientTape` sends them."""
        return [mpi_ops._allreduce(gradient, op=OPS[op], name=f"caramel_gradient_{i}") for i, gradient in enumerate(gradients)]

    def reduce_scatter(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Each tensor averaged over the ranks, each rank keeping a share of it along its first
        axis (the planning policy's collective split, `caramel.planner.policy`)."""
        return mpi_ops._grouped_reducescatter(list(tensors), op=mpi_ops.Average)

    def gather_shards(self, shards: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
        """The shards of `reduce_scatter`, gathered whole on every rank."""
        return mpi_ops.grouped_allgather(list(shards), name=name)

    def lost_peer(self, error: tf.errors.OpError) -> bool:
        """Horovod's ops fail so with Gloo's error (a read error, a connection reset by peer), or
        with Horovod's own once its background loop stopped on it: the message names Gloo or Horovod."""
        return any(name in (error.message or "").lower() for name in ("gloo", "horovod"))

    def leave(self) -> None:
        """Horovod's shutdown: its Gloo connections close, which fails every peer's collective."""
        mpi_ops.shutdown()

    def reform(self, contract: WorkerContract) -> HorovodBackend:
        """Horovod's `init` again (as its own elastic reset does), in the process: Gloo reads the
        HOROVOD_* variables of the new round then."""
        return set_up(contract)

    def broadcast(self, tensors: Sequence[tf.Tensor], root_rank: int = 0, name: str = "caramel_broadcast") -> list[tf.Tensor]:
        return [mpi_ops.broadcast(tf.convert_to_tensor(tensor), root_rank, name=f"{name}_{i}") for i, tensor in enumerate(tensors)]


def gpu_transport(nccl_version: int) -> str:
    """What carries Horovod's allreduce of a GPU tensor, given `hvd.nccl_built()`: NCCL where
    Horovod was built with it (HOROVOD_GPU_OPERATIONS=NCCL: the GPU image), from device memory;
    else Gloo, its ops having CPU kernels only, so that TensorFlow copies each GPU tensor to the
    host and back. CPU tensors go over Gloo either way (HOROVOD_CPU_OPERATIONS)."""
    if nccl_version:
        major, rest = divmod(nccl_version, 10000)
        return f"NCCL {major}.{rest // 100}.{rest % 100} (Horovod built with it)"
    return "Gloo, through host memory: this Horovod was built without NCCL"


def set_up(contract: WorkerContract) -> HorovodBackend:
    """Join the job's ranks: Horovod reads the contract's HOROVOD_* variables and meets the others
    at worker 0's Gloo rendezvous."""
    start()
    backend = HorovodBackend(mpi_ops.rank(), mpi_ops.size(), mpi_ops.local_rank(), mpi_ops.local_size())
    backend.gpu_transport = gpu_transport(mpi_ops.nccl_built())
    return backend


def start(process_sets: Sequence[object] | str = ()) -> None:
    """Start Horovod's core, with Horovod's process sets (its `hvd.init(process_sets=...)`: a list,
    or "dynamic"), which it registers only as it starts. Once started, a later start is a no-op
    in Horovod (until its shutdown), so a script's process sets stay when `set_up` follows."""
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", str(RESPONSE_CACHE_CAPACITY))
    mpi_ops.init(process_sets=process_sets or None)


def fusion_threshold_bytes(setting: str | None) -> int:
    """Horovod's fusion buffer from HOROVOD_FUSION_THRESHOLD, read as Horovod reads it (C's
    strtol: the leading integer, 0 where there is none, "64MB" 64 bytes), its default unset."""
    if setting is None:
        return DEFAULT_FUSION_THRESHOLD
    leading = re.match(r"\s*[+-]?\d+", setting)
    return max(int(leading[0]), 0) if leading else 0
