"""The device a training process trains on: its GPU, narrowed to at start, or the CPU.

The rule is the contract's (`caramel.contract.gpus`): the process sees its worker's GPUs, in order,
and trains on the one of its local rank. Caramel's runtime makes that GPU TensorFlow's only
visible one as it starts (`ctf.init()`, `hvd.init()`), before TensorFlow initializes its devices,
so that a script needs no line for it. TensorFlow takes a visible-device or memory-growth setting
only before it starts, and Caramel's runtime starts it (its collectives, its variables), so the
runtime also turns memory growth on for every GPU the script left unset: Horovod's examples set
it, and pin `gpus[hvd.local_rank()]`, right after `hvd.init()`, and TensorFlow takes both then as
no change. A script that pinned a GPU itself before init keeps its choice.
"""

from __future__ import annotations

import tensorflow as tf

from caramel.contract.env import WorkerContract
from caramel.contract.gpus import ASKED_FOR, rank_gpu

HOST = "/device:CPU:0"
"""Where Caramel's own bookkeeping in a step lives (its stamps, the arm selector's clock and
counts), beside the timestamps it reads, which only the CPU has: on a process that trains on a
GPU, a stamp or a tick waits for a gradient without reading it, so that no gradient, nor any of
these scalars, crosses between the device and the host on the step's path."""


def training_device(contract: WorkerContract) -> str:
    """Narrow TensorFlow to this rank's GPU (see the module's docstring) and say, for the log, what
    the rank trains on; nothing where a job without GPUs runs on TensorFlow's CPU build.
    NoGpuError where its job asks for GPUs and it finds none of its own."""
    gpus = tf.config.list_physical_devices("GPU")
    index = rank_gpu(contract.local_rank, contract.gpus_per_worker, len(gpus))
    if index is None:
        # TensorFlow built with CUDA (the GPU image) looks for a GPU: say once why none is used.
        return f"no GPU: the job asks for none ({ASKED_FOR}), so the ranks train on the CPU" if tf.test.is_built_with_cuda() else ""
    gpu = gpus[index]
    if tf.config.get_visible_devices("GPU") != gpus:
        return f"the GPU the script chose before init, of {len(gpus)} its worker has"
    try:
        for each in gpus:
            if tf.config.experimental.get_memory_growth(each) is None:
                tf.config.experimental.set_memory_growth(each, True)
        tf.config.set_visible_devices(gpu, "GPU")
    except RuntimeError:
        # TensorFlow started before init (the script ran an op): every GPU of the worker stays
        # visible, and its ops would go to the first, the same one in every rank of the worker.
        if len(gpus) > 1:
            raise RuntimeError(
                f"TensorFlow started before hvd.init() / ctf.init(), with all {len(gpus)} GPUs of the worker visible: every "
                "rank would train on the first; call init before any TensorFlow op, or pin the rank's GPU first "
                "(tf.config.set_visible_devices(gpus[local_rank], 'GPU'))"
            ) from None
    return f"GPU {index} of its worker ({gpu.name})"
