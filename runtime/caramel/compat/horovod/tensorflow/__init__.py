"""Horovod's TensorFlow 2 API (`import horovod.tensorflow as hvd`), served by Caramel.

    hvd.init()                                   # joins the job's ranks: caramel.tensorflow.runtime.init
    tape = hvd.DistributedGradientTape(tape)     # caramel.tensorflow.DistributedGradientTape
    opt = hvd.DistributedOptimizer(opt)          # caramel.tensorflow.DistributedOptimizer
    hvd.broadcast_variables(model.variables, root_rank=0)

The API is defined in `_caramel_api` (see there what it serves and how) and the modules it uses,
each loaded on first use of one of its names (`__getattr__` below, PEP 562): importing this package alone loads nothing of
Caramel's runtime or of TensorFlow. That matters because the package's path goes on into the real
Horovod's `horovod/tensorflow`, where Horovod's ops are: Caramel's Horovod backend imports
`horovod.tensorflow.mpi_ops` (and mpi_ops `horovod.tensorflow.util`) through this package, and
that import must not come back into `caramel.tensorflow`, which the backend is part of.

The package's modules (`elastic`, `keras`, `functions`, `compression`, `sync_batch_norm`, and the
real Horovod's `mpi_ops` and `util`) are its attributes too, imported on first use.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import typing as _typing

import horovod as _horovod

if _horovod._real_horovod_dir is not None and _os.path.isdir(_os.path.join(_horovod._real_horovod_dir, "tensorflow")):
    # The real Horovod's modules that this package does not define (mpi_ops, util) come from there.
    __path__.append(_os.path.join(_horovod._real_horovod_dir, "tensorflow"))

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

_MODULES = frozenset({"compression", "elastic", "functions", "sync_batch_norm"})
"""The package's modules that dir() lists, as Horovod's horovod.tensorflow holds them."""
_KERAS_USES = ("distribute", "distributed_optimizer", "local_layer_variables")
"""The API's names that the package's Keras modules use besides Horovod's."""
_DEFINED_ELSEWHERE = {
    "horovod._caramel_support": ("NotSupportedByCaramel",),
    "horovod.tensorflow._caramel_collectives": ("Adasum", "Product", "global_process_set"),
    "horovod.tensorflow._caramel_horovod_ops": (
        "ProcessSet", "add_process_set", "alltoall", "grouped_reducescatter", "join", "reducescatter", "remove_process_set",
    ),
    "horovod.tensorflow._caramel_variable_refs": ("refs_to_vars", "vars_to_refs"),
    "horovod.tensorflow.compression": ("Compression",),
    "horovod.tensorflow.functions": (
        "allgather_object", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "broadcast_variables",
    ),
    "horovod.tensorflow.sync_batch_norm": ("SyncBatchNormalization",),
}  # fmt: skip
_HOROVODS_PRIVATE = ("_executing_eagerly",)
"""Horovod's private names that scripts (and Horovod's own tests) call through the package."""
_WHERE = {name: f"{__name__}._caramel_api" for name in [*__all__, *_KERAS_USES, *_HOROVODS_PRIVATE] if name not in _MODULES}
_WHERE.update({name: module for module, names in _DEFINED_ELSEWHERE.items() for name in names})
"""The module that defines each name the package serves: `_caramel_api`, but for those defined
elsewhere."""


def __getattr__(name: str) -> _typing.Any:
    """One of the names the package serves, its module imported on first use (the API's: Caramel's
    runtime and TensorFlow); or one of the package's modules, imported on first use."""
    if name in _WHERE:
        value = getattr(_importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE) | _MODULES)
