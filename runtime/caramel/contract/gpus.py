"""Which GPUs a worker's training processes see, and which one each trains on: one rule for
`caramel run` and the operator's pods alike, with no line in the script.

A worker asks for `spec.workers.resources.limits nvidia.com/gpu` GPUs (GPUS_PER_WORKER in its
environment). Its training processes all see the worker's GPUs, in order (CUDA_VISIBLE_DEVICES,
which the worker entrypoint sets to `worker_devices`), and the one of local rank l trains on the
l-th of them (`rank_gpu`), which Caramel's runtime makes TensorFlow's only visible GPU when it
starts (`ctf.init()`, `hvd.init()`). Seeing them all, rather than only its own, is what keeps
Horovod's own idiom working unchanged:

    gpus = tf.config.list_physical_devices("GPU")
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

picks the GPU the runtime picked (TensorFlow takes the same choice again as no change), where a
process shown its own GPU alone would fail on `gpus[1]`. In a pod the device plugin gives the
container exactly its GPUs; under `caramel run` the workers share the machine's, and each takes
a block of its own, as each takes a block of ports (`caramel.contract.ports.machine_offsets`). A
job that asks for no GPU sees none: its ranks never share one by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

from caramel.contract.api import GPU_RESOURCE
from caramel.contract.ports import machine_offsets

GPUS_PER_WORKER = "CARAMEL_GPUS_PER_WORKER"
"""The GPUs each worker asks for (spec.workers.resources.limits nvidia.com/gpu); unset: none."""
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ASKED_FOR = f"spec.workers.resources.limits {GPU_RESOURCE}"


class NoGpuError(RuntimeError):
    """A training process of a job that asks for GPUs finds none of its own."""


def worker_devices(machine_devices: str | None, peers: Sequence[str], worker_index: int, gpus_per_worker: int) -> str:
    """CUDA_VISIBLE_DEVICES of the training processes of worker `worker_index` of a gang at
    `peers`: its block of `gpus_per_worker` of the machine's GPUs, after the blocks of the workers
    before it at the same address. `machine_devices` is the machine's own CUDA_VISIBLE_DEVICES
    (the GPUs the workers may use, in its order), None for every GPU by its index. Empty (no GPU)
    for a job that asks for none, and where the machine's list runs out."""
    if gpus_per_worker < 1:
        return ""
    first = machine_offsets(peers, gpus_per_worker)[worker_index]
    wanted = range(first, first + gpus_per_worker)
    if machine_devices is None:
        return ",".join(str(device) for device in wanted)
    listed = [device.strip() for device in machine_devices.split(",") if device.strip()]
    return ",".join(listed[wanted.start : wanted.stop])


def rank_gpu(local_rank: int, gpus_per_worker: int, gpus_found: int) -> int | None:
    """The GPU, by its index among those the training process finds, that the rank of
    `local_rank` trains on; None for the CPU, where its job asks for no GPU. NoGpuError where
    its job asks for GPUs and it finds fewer than its local rank needs: a rank that went on on the
    CPU would meet GPU tensors in its peers' collectives, which fails or hangs there."""
    if gpus_per_worker < 1:
        return None
    if local_rank >= gpus_found:
        found = f"finds {gpus_found} GPU(s)" if gpus_found else "finds no GPU"
        raise NoGpuError(
            f"the training process of local rank {local_rank} {found} where its job asks for {gpus_per_worker} per worker "
            f"({ASKED_FOR}): is the NVIDIA driver on the node, and the container given the GPUs (the device plugin, "
            "or --gpus under docker)?"
        )
    return local_rank
