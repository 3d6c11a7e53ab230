"""Horovod's Keras API (`import horovod.tensorflow.keras as hvd`), served by Caramel.

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(opt), loss=..., experimental_run_tf_function=False)
    model.fit(data, steps_per_epoch=..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                                   hvd.callbacks.MetricAverageCallback()])

`BroadcastGlobalVariablesCallback` is Caramel's Keras callback (`caramel.tensorflow.keras.
TrainingCallback`): it broadcasts the root's variables when training begins, runs Keras' training
step in Caramel's graphs with Caramel's scheduling, records metrics and progress, and checks at the
end that all ranks hold the same weights. The functions here return NumPy values, as Horovod's
Keras functions do; `load_model` loads a saved model and makes its optimizer Horovod's
DistributedOptimizer, keeping its state; `broadcast_global_variables` is horovod.tensorflow's. Importing this module accepts the Keras 2 idioms of Horovod-era scripts
(`horovod._caramel_keras2_idioms`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import horovod.tensorflow as _hvd
from caramel.tensorflow.horovod_options import horovod_signature
from caramel.tensorflow.keras_version import keras_2
from horovod import _caramel_keras2_idioms
from horovod._caramel_support import refuse, unsupported
from horovod.tensorflow import (
    Average,
    Compression,
    ProcessSet,
    Sum,
    add_process_set,
    broadcast_global_variables,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    sycl_built,
)
from horovod.tensorflow._caramel_api import distribute, distributed_optimizer
from horovod.tensorflow.keras import callbacks, elastic

_caramel_keras2_idioms.install()


@horovod_signature(
    "optimizer", "name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "gradient_predivide_factor", "op",
    "backward_passes_per_step", "average_aggregated_gradients", "num_groups", "groups", "process_set", "scale_local_gradients",
    process_set=global_process_set,
)  # fmt: skip
def DistributedOptimizer(optimizer: Any, **horovod_options: Any) -> Any:  # noqa: N802 (Horovod's name)
    """The Keras optimizer, whose updates average (op Sum: sum) the gradients over all ranks first."""
    return distributed_optimizer(optimizer, **horovod_options)


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Any = Compression.none,
) -> Any:
    """`value` reduced over all ranks (Average by default), as a NumPy value."""
    return _hvd.allreduce(
        tf.convert_to_tensor(value), average=average, compression=compression, op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, name=name,
    ).numpy()  # fmt: skip


def allgather(value: Any, name: str | None = None) -> Any:
    """Every rank's `value` joined along the first axis in rank order (first dimensions may differ)."""
    return _hvd.allgather(tf.convert_to_tensor(value), name=name).numpy()


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """Rank root_rank's `value`, on every rank."""
    return _hvd.broadcast(tf.convert_to_tensor(value), root_rank, name=name).numpy()


def load_model(
    filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None, compression: Any = Compression.none, legacy_opts: bool = False
) -> Any:
    """A saved Keras model, its optimizer Horovod's DistributedOptimizer with the state it was saved
    with (the optimizer itself becomes one: `horovod.tensorflow.distribute`). `custom_optimizers`
    are optimizer classes the file may name, besides Keras' own. `legacy_opts` (a model compiled
    with Keras 2's legacy optimizers) changes nothing where tf.keras is Keras 2, which loads them
    as they were saved; Keras 3 has none."""
    if legacy_opts and not keras_2():
        refuse(
            "hvd.load_model(legacy_opts=True)",
            "tf.keras is Keras 3 here, which has no legacy optimizers: set TF_USE_LEGACY_KERAS=1 in the job's spec.env for Keras 2",
        )
    objects = {optimizer.__name__: optimizer for optimizer in custom_optimizers or ()}
    model = tf.keras.models.load_model(filepath, custom_objects={**objects, **(custom_objects or {})})
    if getattr(model, "optimizer", None) is not None:
        distribute(model.optimizer, compression=compression)
    return model


reducescatter = unsupported("hvd.reducescatter", "use hvd.allreduce")

__all__ = [
    "Average", "Compression", "DistributedOptimizer", "ProcessSet", "Sum", "add_process_set", "allgather", "allreduce",
    "broadcast", "broadcast_global_variables", "callbacks", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "elastic", "global_process_set", "gloo_built", "gloo_enabled", "init", "is_initialized", "load_model", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter",
    "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline", "sycl_built",
]  # fmt: skip
