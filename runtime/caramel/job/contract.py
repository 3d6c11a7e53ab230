"""The environment contract between whoever starts a worker and the worker itself.

`caramel run` (workers as local processes) and the operator (workers as pods) both call
`worker_env` and `worker_command`; the worker entrypoint reads the result back with
`WorkerContract.from_env` and derives each training process's rank with `slot_env`. Nothing
else passes information to a worker, so both modes run exactly the same way.

A worker is a Horovod *host*: it runs `slotsPerWorker` training processes (slots). Rank r of
the job lives on worker r // slots as slot r % slots.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from caramel.job.api import CaramelJob, Checkpoint, Scheduling, Tuning

TENSORFLOW_ENV = {
    # Horovod 0.28.1 on TensorFlow 2.16+ works only with legacy Keras (the tf-keras package).
    "TF_USE_LEGACY_KERAS": "1",
    # Hide TensorFlow's start-up chatter (CUDA probing on CPU machines); spec.env can override.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def worker_name(job: CaramelJob, worker_index: int) -> str:
    """Stable name of a worker: its pod name in a cluster and its Horovod hostname everywhere."""
    return f"{job.name}-worker-{worker_index}"


def worker_env(
    job: CaramelJob, worker_index: int, peers: Sequence[str], tuning: Tuning | None = None
) -> dict[str, str]:
    """The environment of one worker.

    `peers[i]` is the address at which worker i can be reached: its DNS name in a cluster,
    127.0.0.1 for local processes. Worker 0 serves the rendezvous. Workers that share an
    address share a machine, so each takes its own block of metrics ports. `tuning` is what
    an earlier gang of the same job tuned, for a restarted gang to start from.
    """
    spec = job.spec
    replicas, slots = spec.workers.replicas, spec.workers.slots_per_worker
    if len(peers) != replicas:
        raise ValueError(f"expected {replicas} peer addresses (spec.workers.replicas), got {len(peers)}")
    if not 0 <= worker_index < replicas:
        raise ValueError(f"worker index {worker_index} is outside 0..{replicas - 1}")
    processes_before_on_same_machine = slots * sum(1 for peer in peers[:worker_index] if peer == peers[worker_index])
    env = {
        **TENSORFLOW_ENV,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": peers[0],
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(spec.rendezvous.port),
        "HOROVOD_HOSTNAME": worker_name(job, worker_index),
        "HOROVOD_SIZE": str(job.world_size),
        "HOROVOD_LOCAL_SIZE": str(slots),
        "HOROVOD_CROSS_RANK": str(worker_index),
        "HOROVOD_CROSS_SIZE": str(replicas),
        "CARAMEL_JOB_NAME": job.name,
        "CARAMEL_WORKER_INDEX": str(worker_index),
        "CARAMEL_HOSTS": ",".join(f"{worker_name(job, i)}:{slots}" for i in range(replicas)),
        "CARAMEL_SCHEDULING": spec.caramel.model_dump_json(by_alias=True),
        "CARAMEL_METRICS_PORT": str(spec.metrics.port + processes_before_on_same_machine) if spec.metrics.enabled else "",
    }
    if spec.rendezvous.network_interface:
        env["HOROVOD_GLOO_IFACE"] = spec.rendezvous.network_interface
    if spec.checkpoint:
        env["CARAMEL_CHECKPOINT"] = spec.checkpoint.model_dump_json(by_alias=True)
    if tuning:
        env["CARAMEL_TUNING"] = tuning.model_dump_json(by_alias=True)
    env.update({var.name: var.value for var in spec.env})
    return env


def worker_command(job: CaramelJob, python: str = "python") -> list[str]:
    """The argv a worker runs: the entrypoint, which starts every slot with the training command."""
    spec = job.spec
    training = [python, spec.script] if spec.script else list(spec.command or [])
    return [python, "-m", "caramel.launch.entrypoint", "--", *training, *spec.args]


def slot_env(worker: Mapping[str, str], slot: int) -> dict[str, str]:
    """The extra variables of training process `slot` of a worker: its Horovod ranks and metrics port."""
    local_size = int(worker["HOROVOD_LOCAL_SIZE"])
    rank = int(worker["CARAMEL_WORKER_INDEX"]) * local_size + slot
    env = {"HOROVOD_RANK": str(rank), "HOROVOD_LOCAL_RANK": str(slot)}
    if worker.get("CARAMEL_METRICS_PORT"):
        env["CARAMEL_METRICS_PORT"] = str(int(worker["CARAMEL_METRICS_PORT"]) + slot)
    return env


@dataclass(frozen=True)
class WorkerContract:
    """What a worker or training process reads from its environment."""

    job_name: str
    worker_index: int
    hosts: str
    world_size: int
    slots_per_worker: int
    rendezvous_addr: str
    rendezvous_port: int
    scheduling: Scheduling
    checkpoint: Checkpoint | None
    tuning: Tuning | None
    metrics_port: int | None
    rank: int | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerContract:
        missing = [name for name in ("CARAMEL_JOB_NAME", "CARAMEL_WORKER_INDEX", "HOROVOD_SIZE") if name not in environ]
        if missing:
            raise RuntimeError(
                f"not started as a Caramel worker: {', '.join(missing)} unset "
                "(start jobs with `caramel run` or the operator)"
            )
        checkpoint = environ.get("CARAMEL_CHECKPOINT")
        tuning = environ.get("CARAMEL_TUNING")
        return cls(
            job_name=environ["CARAMEL_JOB_NAME"],
            worker_index=int(environ["CARAMEL_WORKER_INDEX"]),
            hosts=environ["CARAMEL_HOSTS"],
            world_size=int(environ["HOROVOD_SIZE"]),
            slots_per_worker=int(environ["HOROVOD_LOCAL_SIZE"]),
            rendezvous_addr=environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
            rendezvous_port=int(environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
            scheduling=Scheduling.model_validate_json(environ.get("CARAMEL_SCHEDULING", "{}")),
            checkpoint=Checkpoint.model_validate_json(checkpoint) if checkpoint else None,
            tuning=Tuning.model_validate_json(tuning) if tuning else None,
            metrics_port=int(environ["CARAMEL_METRICS_PORT"]) if environ.get("CARAMEL_METRICS_PORT") else None,
            rank=int(environ["HOROVOD_RANK"]) if "HOROVOD_RANK" in environ else None,
        )
