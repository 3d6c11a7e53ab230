"""Horovod's API for standalone Keras (`import horovod.keras as hvd`). Under TensorFlow 2.16+ Keras
runs on TensorFlow, so this is `horovod.tensorflow.keras`, served by Caramel, with what Horovod's
standalone Keras API has besides or otherwise: `DistributedOptimizer` with fewer keywords,
`PartialDistributedOptimizer`, whose local layers' gradients each
rank keeps to itself, and the `Adasum` op (refused where used, as everywhere)."""

from typing import Any

from caramel.tensorflow.horovod_options import horovod_signature
from horovod.tensorflow import Adasum, global_process_set
from horovod.tensorflow._caramel_api import distributed_optimizer, local_layer_variables
from horovod.tensorflow.keras import *  # noqa: F403
from horovod.tensorflow.keras import __all__ as _tensorflow_keras_all
from horovod.keras import callbacks, elastic  # type: ignore[no-redef]  # noqa: F401 (standalone Keras' own submodules, as Horovod's)


@horovod_signature(  # type: ignore[no-redef]  # standalone Keras' own replaces tf.keras', with fewer keywords
    "optimizer", "name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "gradient_predivide_factor", "op",
    "num_groups", "groups",
)  # fmt: skip
def DistributedOptimizer(optimizer: Any, **horovod_options: Any) -> Any:  # noqa: N802 (Horovod's name)
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first
    (standalone Keras' keywords, fewer than horovod.tensorflow.keras's)."""
    return distributed_optimizer(optimizer, **horovod_options)


@horovod_signature(
    "optimizer", "name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "gradient_predivide_factor", "op",
    "groups", "process_set", "local_layers", "scale_local_gradients",
    process_set=global_process_set, local_layers=None,
)  # fmt: skip
def PartialDistributedOptimizer(optimizer: Any, local_layers: Any, **horovod_options: Any) -> Any:  # noqa: N802 (Horovod's name)
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first,
    those of the local layers' trainable weights excepted: each rank keeps them to itself."""
    return distributed_optimizer(optimizer, local_layer_variables(local_layers), **horovod_options)


__all__ = [*_tensorflow_keras_all, "Adasum", "PartialDistributedOptimizer"]  # DistributedOptimizer among the first
