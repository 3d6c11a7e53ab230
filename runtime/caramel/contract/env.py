"""The environment contract between whoever starts a worker and the worker itself.

`caramel run` (workers as local processes) and the operator (workers as pods) both call
`worker_env` and `worker_command`; the worker entrypoint reads the result back with
`WorkerContract.from_env` and derives each training process's rank with `slot_env`. Nothing
else passes information to a worker, so both modes run exactly the same way.

A worker is a Horovod *host*: it runs `slotsPerWorker` training processes (slots). Rank r of
the job lives on worker r // slots as slot r % slots.

Every port a worker is told of follows the rules of `caramel.contract.ports`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from caramel.contract.api import CaramelJob, Checkpoint, MemoryAllocator, Scheduling, Tuning
from caramel.contract.gpus import GPUS_PER_WORKER
from caramel.contract.ports import (
    COLLECTIVE_PORT,
    METRICS_PORT,
    TRANSPORT_PORT,
    PortMap,
    collective_port,
    rank_addresses,
    slot_ports,
)
from caramel.contract.topology import WireTopology

# How long the workers of a gang wait for each other at the rendezvous, worker 0 included (a slow
# image pull or a busy scheduler can hold one back), and Horovod's Gloo for the other ranks
# (HOROVOD_GLOO_TIMEOUT_SECONDS, whose default of 30 s failed whole gangs whenever one pod started
# late). Gloo also bounds each collective's wait for a peer by it; a peer that dies is seen sooner,
# by `caramel run` or the operator, which stop the whole gang.
RENDEZVOUS_TIMEOUT_SECONDS = 600
ROUND_WORKERS_VARIABLE = "CARAMEL_ROUND_WORKERS"
"""The workers of the rendezvous round a training process's ranks come from, by name, in rank
order (`caramel.launch.rendezvous.Round.rank_env` sets it); unset, every worker of CARAMEL_HOSTS."""

TENSORFLOW_ENV = {
    # Hide TensorFlow's start-up chatter (CUDA probing on CPU machines); spec.env can override.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def worker_name(job: CaramelJob, worker_index: int) -> str:
    """Stable name of a worker: its pod name in a cluster and its Horovod hostname everywhere."""
    return f"{job.name}-worker-{worker_index}"


def worker_env(
    job: CaramelJob,
    worker_index: int,
    peers: Sequence[str],
    tuning: Tuning | None = None,
    topology: WireTopology | None = None,
    rendezvous_timeout_seconds: float = RENDEZVOUS_TIMEOUT_SECONDS,
) -> dict[str, str]:
    """The environment of one worker.

    `peers[i]` is the address at which worker i can be reached: its DNS name in a cluster,
    127.0.0.1 for local processes. There is one per worker of the gang, so their number is the
    gang's size: spec.workers.replicas, or fewer down to minReplicas while they do not all fit.
    Worker 0 serves the rendezvous. Workers that share an
    address share a machine, so each takes its own block of metrics and transport ports.
    `tuning` is what an earlier gang of the same job tuned, for a restarted gang to start from.
    `topology` is the network under the job, one host per rank in rank order (the placed
    nodes in a cluster, a topology file locally); without one the job's network is flat.
    `rendezvous_timeout_seconds` is how long every worker waits for the others (worker 0 included).
    """
    spec = job.spec
    replicas, slots = len(peers), spec.workers.slots
    if not spec.workers.min_workers <= replicas <= spec.workers.replicas:
        expected = (
            f"{spec.workers.replicas} peer addresses (spec.workers.replicas)"
            if spec.workers.min_workers == spec.workers.replicas
            else f"{spec.workers.min_workers} to {spec.workers.replicas} peer addresses (spec.workers.minReplicas to replicas)"
        )
        raise ValueError(f"expected {expected}, got {replicas}")
    if not 0 <= worker_index < replicas:
        raise ValueError(f"worker index {worker_index} is outside 0..{replicas - 1}")
    world_size = replicas * slots
    if topology is not None and topology.size != world_size:
        raise ValueError(
            f"the topology has {topology.size} hosts, the gang {world_size} ranks "
            "(its workers x spec.workers.slotsPerWorker): it needs one host per rank"
        )
    ports = PortMap.of(job).worker_ports(peers, worker_index)
    env = {
        **TENSORFLOW_ENV,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": peers[0],
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(spec.rendezvous.port),
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(math.ceil(rendezvous_timeout_seconds)),
        "HOROVOD_HOSTNAME": worker_name(job, worker_index),
        "HOROVOD_SIZE": str(world_size),
        "HOROVOD_LOCAL_SIZE": str(slots),
        "HOROVOD_CROSS_RANK": str(worker_index),
        "HOROVOD_CROSS_SIZE": str(replicas),
        # The ranks of the whole gang, for scripts that keep the global batch of a full gang.
        "CARAMEL_FULL_SIZE": str(job.world_size),
        # The fewest workers the gang may run with (spec.workers.minReplicas): an elastic gang's
        # rendezvous closes a round of survivors only with as many, and its script runs elastic
        # only where it is fewer than the whole gang.
        "CARAMEL_MIN_WORKERS": str(spec.workers.min_workers),
        "CARAMEL_JOB_NAME": job.name,
        "CARAMEL_WORKER_INDEX": str(worker_index),
        "CARAMEL_HOSTS": ",".join(f"{worker_name(job, i)}:{slots}" for i in range(replicas)),
        "CARAMEL_SCHEDULING": spec.caramel.model_dump_json(by_alias=True),
        "CARAMEL_MEMORY_ALLOCATOR": spec.workers.memory_allocator.value,
        METRICS_PORT: str(ports[METRICS_PORT]) if METRICS_PORT in ports else "",
        "CARAMEL_PEERS": ",".join(peers),
        COLLECTIVE_PORT: str(ports[COLLECTIVE_PORT]),
    }
    if spec.rendezvous.network_interface:
        env["HOROVOD_GLOO_IFACE"] = spec.rendezvous.network_interface
    if TRANSPORT_PORT in ports:  # only for jobs that may run the multitree transport
        env[TRANSPORT_PORT] = str(ports[TRANSPORT_PORT])
    if topology is not None:
        env["CARAMEL_TOPOLOGY"] = topology.to_json()
    if spec.workers.resources.gpus:
        env[GPUS_PER_WORKER] = str(spec.workers.resources.gpus)
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
    """The extra variables of training process `slot` of a worker: its Horovod ranks, metrics
    port and transport port."""
    local_size = int(worker["HOROVOD_LOCAL_SIZE"])
    rank = int(worker["CARAMEL_WORKER_INDEX"]) * local_size + slot
    return {"HOROVOD_RANK": str(rank), "HOROVOD_LOCAL_RANK": str(slot), **slot_ports(worker, slot)}


@dataclass(frozen=True)
class WorkerContract:
    """What a worker or training process reads from its environment."""

    job_name: str
    worker_index: int
    hosts: str
    world_size: int
    """Ranks of the gang that runs (HOROVOD_SIZE)."""
    full_world_size: int
    """Ranks of the whole gang, spec.workers.replicas x slotsPerWorker (CARAMEL_FULL_SIZE): more than
    world_size while the gang runs short of workers (spec.workers.minReplicas)."""
    slots_per_worker: int
    min_workers: int
    """The fewest workers the gang may run with (CARAMEL_MIN_WORKERS, spec.workers.minReplicas)."""
    rendezvous_addr: str
    rendezvous_port: int
    rendezvous_timeout_seconds: float
    """How long to wait for the other workers (HOROVOD_GLOO_TIMEOUT_SECONDS, which worker 0's Gloo
    obeys too)."""
    scheduling: Scheduling
    memory_allocator: MemoryAllocator
    gpus_per_worker: int
    """The GPUs each worker asks for (spec.workers.resources.limits nvidia.com/gpu): each of its
    training processes trains on one of them (`caramel.contract.gpus`); 0 for none."""
    checkpoint: Checkpoint | None
    tuning: Tuning | None
    metrics_port: int | None
    rank: int | None
    peers: tuple[str, ...]
    """Every worker's address (CARAMEL_PEERS), in the order of the gang as it started."""
    round_workers: tuple[int, ...]
    """The workers whose ranks make up the world, in rank order, as indices of the gang as it
    started: every worker, or those of the rendezvous round the ranks re-formed in
    (ROUND_WORKERS_VARIABLE, by name), where an elastic gang lost or took back some."""
    topology: WireTopology | None
    """The network under the ranks of the world, one host per rank, in rank order: CARAMEL_TOPOLOGY
    (the gang as it started) cut down to the round's workers. None when the job has none.
    `caramel.network.wire.job_topology` gives the network itself (a flat one for None)."""

    def share_of(self, global_batch: int) -> int:
        """This rank's examples of a step's `global_batch`, split over the ranks that run: a script
        that keeps its global batch whatever the gang's size passes this to its data pipeline (and
        as TrainingRun's batch_size). Where the ranks do not divide it, the first ranks take one
        example more."""
        if self.rank is None:
            raise RuntimeError("HOROVOD_RANK is unset: a batch is shared among training processes, not workers")
        if global_batch < self.world_size:
            raise ValueError(f"a global batch of {global_batch} cannot give each of {self.world_size} ranks an example")
        return global_batch // self.world_size + (self.rank < global_batch % self.world_size)

    @property
    def may_run_short(self) -> bool:
        """Whether the gang may train on with fewer workers than it has (spec.workers.minReplicas
        below replicas): an elastic script's ranks then re-form when one is lost."""
        return self.min_workers * self.slots_per_worker < self.full_world_size

    @property
    def ranks_on_this_machine(self) -> int:
        """The training processes that share this worker's machine: its slots, and those of every
        worker at the same address (`caramel run`'s workers all share one), as the ports'
        `machine_offsets` counts them."""
        if not self.peers:
            return self.slots_per_worker
        return self.peers.count(self.peers[self.worker_index]) * self.slots_per_worker

    @property
    def local_rank(self) -> int:
        """This training process's slot on its worker (Horovod's local rank)."""
        return self.required_rank % self.slots_per_worker

    @property
    def required_rank(self) -> int:
        """This training process's rank (HOROVOD_RANK, which every training process has)."""
        if self.rank is None:
            raise RuntimeError("HOROVOD_RANK is unset: not a training process of a Caramel worker")
        return self.rank

    @property
    def transport_addresses(self) -> list[tuple[str, int]]:
        """Where each rank's multitree transport listens, in rank order."""
        return self._world_addresses(self.scheduling.transport_port)

    @property
    def collective_addresses(self) -> list[tuple[str, int]]:
        """Where each rank's TensorFlow server listens (the tensorflow backend), in rank order."""
        return self._world_addresses(collective_port(self.rendezvous_port))

    def _world_addresses(self, first_port: int) -> list[tuple[str, int]]:
        """Where each rank of the world listens on a per-process port: each worker keeps the ports
        it was given in the gang as it started, whichever ranks it has now."""
        slots = self.slots_per_worker
        started = rank_addresses(self._required_peers(), slots, first_port)
        return [started[worker * slots + slot] for worker in self.round_workers for slot in range(slots)]

    @property
    def collective_timeout_seconds(self) -> float:
        """How long a collective waits for its peers: as long as the workers wait for each other
        at the rendezvous (a peer may be tracing its first step, or restoring a checkpoint), as
        Gloo's timeout bounds Horovod's. A peer whose process ended fails it sooner."""
        return self.rendezvous_timeout_seconds

    def _required_peers(self) -> tuple[str, ...]:
        if not self.peers:
            raise RuntimeError("CARAMEL_PEERS is unset: not started as a Caramel worker (start jobs with `caramel run` or the operator)")
        return self.peers

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
        world_size = int(environ["HOROVOD_SIZE"])
        slots = int(environ["HOROVOD_LOCAL_SIZE"])
        round_workers = _round_workers(environ["CARAMEL_HOSTS"], environ.get(ROUND_WORKERS_VARIABLE), world_size, slots)
        return cls(
            job_name=environ["CARAMEL_JOB_NAME"],
            worker_index=int(environ["CARAMEL_WORKER_INDEX"]),
            hosts=environ["CARAMEL_HOSTS"],
            world_size=world_size,
            full_world_size=int(environ.get("CARAMEL_FULL_SIZE") or world_size),
            slots_per_worker=slots,
            min_workers=int(environ.get("CARAMEL_MIN_WORKERS") or len(environ["CARAMEL_HOSTS"].split(","))),
            rendezvous_addr=environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
            rendezvous_port=int(environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
            rendezvous_timeout_seconds=float(environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS") or RENDEZVOUS_TIMEOUT_SECONDS),
            scheduling=Scheduling.model_validate_json(environ.get("CARAMEL_SCHEDULING", "{}")),
            memory_allocator=_memory_allocator(environ.get("CARAMEL_MEMORY_ALLOCATOR")),
            gpus_per_worker=int(environ.get(GPUS_PER_WORKER) or 0),
            checkpoint=Checkpoint.model_validate_json(checkpoint) if checkpoint else None,
            tuning=Tuning.model_validate_json(tuning) if tuning else None,
            metrics_port=int(environ[METRICS_PORT]) if environ.get(METRICS_PORT) else None,
            rank=int(environ["HOROVOD_RANK"]) if "HOROVOD_RANK" in environ else None,
            peers=tuple(environ["CARAMEL_PEERS"].split(",")) if environ.get("CARAMEL_PEERS") else (),
            round_workers=round_workers,
            topology=_topology(environ.get("CARAMEL_TOPOLOGY"), environ["CARAMEL_HOSTS"], round_workers, slots),
        )


def _memory_allocator(text: str | None) -> MemoryAllocator:
    if not text:
        return MemoryAllocator.TCMALLOC
    try:
        return MemoryAllocator(text)
    except ValueError:
        choices = ", ".join(choice.value for choice in MemoryAllocator)
        raise RuntimeError(f"CARAMEL_MEMORY_ALLOCATOR is {text!r}; it must be one of {choices}") from None


def _round_workers(hosts: str, round_hosts: str | None, world_size: int, slots: int) -> tuple[int, ...]:
    """The world's workers in rank order, as indices of CARAMEL_HOSTS (see `WorkerContract.round_workers`)."""
    names = [entry.rpartition(":")[0] for entry in hosts.split(",")]
    if not round_hosts:
        return tuple(range(len(names)))
    unknown = [name for name in round_hosts.split(",") if name not in names]
    if unknown:
        raise RuntimeError(f"{ROUND_WORKERS_VARIABLE} names {', '.join(unknown)}, which CARAMEL_HOSTS ({hosts}) does not")
    workers = tuple(names.index(name) for name in round_hosts.split(","))
    if len(workers) * slots != world_size:
        raise RuntimeError(f"{ROUND_WORKERS_VARIABLE} names {len(workers)} workers of {slots} slots; HOROVOD_SIZE is {world_size}")
    return workers


def _topology(text: str | None, hosts: str, round_workers: tuple[int, ...], slots: int) -> WireTopology | None:
    """CARAMEL_TOPOLOGY, one host per rank of the gang as it started, cut down to the round's workers."""
    if not text:
        return None
    try:
        topology = WireTopology.parse(text)
    except ValueError as error:
        raise RuntimeError(f"CARAMEL_TOPOLOGY: {error}") from None
    started = len(hosts.split(",")) * slots
    if topology.size != started:
        raise RuntimeError(f"CARAMEL_TOPOLOGY has {topology.size} hosts; the gang of CARAMEL_HOSTS has {started} ranks")
    return topology.of_hosts([worker * slots + slot for worker in round_workers for slot in range(slots)])
