"""Horovod's API for standalone Keras (`import horovod.keras as hvd`). Under TensorFlow 2.16+ Keras
runs on TensorFlow, so this is `horovod.tensorflow.keras`, served by Caramel, with what Horovod's
standalone Keras API has besides or otherwise: `DistributedOptimizer` with fewer keywords,
`PartialDistributedOptimizer`, whose local layers' gradients each
rank keeps to itself, and the `Adasum` op (refused where used, as everywhere)."""

from typing import Any

from horovod.tensorflow import Adasum, distributed_optimizer, global_process_set, local_layer_variables
from horovod.tensorflow.keras import *  # noqa: F403
from horovod.tensorflow.keras import Average, Compression
from horovod.tensorflow.keras import __all__ as _tensorflow_keras_all
from horovod.keras import callbacks, elastic  # type: ignore[no-redef]  # noqa: F401 (standalone Keras' own submodules, as Horovod's)


def DistributedOptimizer(  # type: ignore[no-redef]  # noqa: N802 (Horovod's name; standalone Keras' own, fewer keywords)
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    num_groups: int = 0,
    groups: Any = None,
) -> Any:
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first
    (standalone Keras' keywords, fewer than horovod.tensorflow.keras's)."""
    return distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op, num_groups=num_groups,
        groups=groups,
    )  # fmt: skip


def PartialDistributedOptimizer(  # noqa: N802 (Horovod's name)
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    groups: Any = None,
    process_set: Any = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first,
    those of the local layers' trainable weights excepted: each rank keeps them to itself."""
    return distributed_optimizer(
        optimizer, local_layer_variables(local_layers), name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
    )  # fmt: skip


__all__ = [*_tensorflow_keras_all, "Adasum", "PartialDistributedOptimizer"]  # DistributedOptimizer among the first
