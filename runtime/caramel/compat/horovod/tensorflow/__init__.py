"""Horovod's TensorFlow 2 API (`import horovod.tensorflow as hvd`), served by Caramel.

    hvd.init()                                   # joins the job's ranks: caramel.tensorflow.runtime.init
    tape = hvd.DistributedGradientTape(tape)     # caramel.tensorflow.DistributedGradientTape
    opt = hvd.DistributedOptimizer(opt)          # caramel.tensorflow.DistributedOptimizer
    hvd.broadcast_variables(model.variables, root_rank=0)

The API is defined in `_caramel_api` (see there what it serves and how) and the modules named
below; this package gathers their names, and holds Horovod's modules (`elastic`, `functions`,
`compression`, `sync_batch_norm`) as Horovod's does.
"""

from __future__ import annotations

import os as _os
import sys as _sys

import horovod as _horovod
from caramel.collectives.horovod_installation import bind_loaded_submodules
from horovod._caramel_support import NotSupportedByCaramel
from horovod.tensorflow import compression, elastic, functions, sync_batch_norm
from horovod.tensorflow._caramel_api import (
    Average,
    DistributedGradientTape,
    DistributedOptimizer,
    Max,
    Min,
    PartialDistributedGradientTape,
    Sum,
    _executing_eagerly,  # Horovod's private name (from its util), which scripts and Horovod's own tests call as hvd._executing_eagerly
    allgather,
    allreduce,
    broadcast,
    broadcast_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allreduce,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_rank_op,
    local_size,
    local_size_op,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    process_set_included_op,
    rank,
    rank_op,
    rocm_built,
    shutdown,
    size,
    size_op,
    start_timeline,
    stop_timeline,
    sycl_built,
)
from horovod.tensorflow._caramel_collectives import Adasum, Product, global_process_set
from horovod.tensorflow._caramel_horovod_ops import (
    ProcessSet,
    add_process_set,
    alltoall,
    grouped_reducescatter,
    join,
    reducescatter,
    remove_process_set,
)
from horovod.tensorflow._caramel_variable_refs import refs_to_vars, vars_to_refs
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.functions import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization

if _horovod._real_horovod_dir is not None and _os.path.isdir(_os.path.join(_horovod._real_horovod_dir, "tensorflow")):
    # Scripts import the real Horovod's modules this package does not define (mpi_ops, util) as
    # they would from Horovod: the path goes on there.
    __path__.append(_os.path.join(_horovod._real_horovod_dir, "tensorflow"))
    bind_loaded_submodules(_sys.modules[__name__])

__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer", "Max", "Min", "NotSupportedByCaramel",
    "PartialDistributedGradientTape", "ProcessSet", "Product", "Sum", "SyncBatchNormalization", "add_process_set", "allgather",
    "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_", "broadcast_global_variables", "broadcast_object",
    "broadcast_object_fn", "broadcast_variables", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_rank_op", "local_size", "local_size_op", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "process_set_included_op", "rank", "rank_op", "reducescatter",
    "refs_to_vars", "remove_process_set", "rocm_built", "shutdown", "size", "size_op", "start_timeline", "stop_timeline", "sycl_built",
    "vars_to_refs",
]  # fmt: skip
