"""Every port of a job, one rule each: the env contract, `caramel run` and the operator's
builders all take them from here.

A gang binds
- the rendezvous port (spec.rendezvous.port): worker 0's rendezvous server, one per gang;
- per training process, a port of each kind the job uses:
  - the collective port of its TensorFlow server (the tensorflow backend): the rendezvous port
    plus one onwards;
  - its /metrics, where spec.metrics.enabled: spec.metrics.port onwards;
  - its multitree transport, for jobs that may run MULTITREE (spec.caramel.allreduce other than
    Ring): spec.caramel.transportPort onwards.

Processes that share a machine (workers with the same address) take consecutive ports: worker
w's first process takes the first port plus the processes of the workers before it at the same
address (`machine_offsets`), each next slot the port after. In a cluster every worker has an
address of its own, so every pod binds the same ports; under `caramel run` every worker shares
127.0.0.1, so the whole gang's ports follow one another.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from caramel.contract.api import Allreduce, CaramelJob

# The worker environment's variables that hold a first per-process port (the worker's first
# training process's); each slot adds its number (`slot_ports`).
METRICS_PORT = "CARAMEL_METRICS_PORT"
COLLECTIVE_PORT = "CARAMEL_COLLECTIVE_PORT"
TRANSPORT_PORT = "CARAMEL_TRANSPORT_PORT"
PER_PROCESS = (METRICS_PORT, TRANSPORT_PORT, COLLECTIVE_PORT)


def collective_port(rendezvous_port: int) -> int:
    """The collective port (TensorFlow's server) of a machine's first training process: the one
    after worker 0's rendezvous port."""
    return rendezvous_port + 1


def machine_offsets(peers: Sequence[str], slots: int) -> list[int]:
    """For each worker, the training processes of the workers before it at the same address:
    how far past a first port its own ports start."""
    seen: Counter[str] = Counter()
    offsets = []
    for peer in peers:
        offsets.append(slots * seen[peer])
        seen[peer] += 1
    return offsets


def rank_addresses(peers: Sequence[str], slots: int, first_port: int) -> list[tuple[str, int]]:
    """Where each rank listens on a per-process port whose first is `first_port`, in rank order."""
    return [
        (peer, first_port + offset + slot)
        for peer, offset in zip(peers, machine_offsets(peers, slots))
        for slot in range(slots)
    ]


def slot_ports(worker: Mapping[str, str], slot: int) -> dict[str, str]:
    """The per-process ports of training process `slot` of a worker, from the worker's environment."""
    return {variable: str(int(worker[variable]) + slot) for variable in PER_PROCESS if worker.get(variable)}


@dataclass(frozen=True)
class PortMap:
    """The first port of each kind a job's processes bind."""

    rendezvous: int
    """Worker 0's rendezvous server (spec.rendezvous.port)."""
    metrics: int | None
    """The first training process's /metrics (spec.metrics.port); None where metrics are off."""
    transport: int | None
    """The first training process's multitree transport (spec.caramel.transportPort); None for a
    job whose all-reduce is the ring, which never runs it."""
    slots: int
    """Training processes per worker (spec.workers.slotsPerWorker)."""

    @classmethod
    def of(cls, job: CaramelJob) -> PortMap:
        spec = job.spec
        return cls(
            rendezvous=spec.rendezvous.port,
            metrics=spec.metrics.port if spec.metrics.enabled else None,
            transport=spec.caramel.transport_port if spec.caramel.allreduce != Allreduce.RING else None,
            slots=spec.workers.slots,
        )

    @property
    def collective(self) -> int:
        return collective_port(self.rendezvous)

    def per_process(self) -> dict[str, tuple[int, str]]:
        """Each per-process port the job uses: its variable, its first port and the field it comes from."""
        ports = {COLLECTIVE_PORT: (self.collective, "spec.rendezvous.port + 1, the collective port")}
        if self.metrics is not None:
            ports[METRICS_PORT] = (self.metrics, "spec.metrics.port")
        if self.transport is not None:
            ports[TRANSPORT_PORT] = (self.transport, "spec.caramel.transportPort")
        return ports

    def worker_ports(self, peers: Sequence[str], worker_index: int) -> dict[str, int]:
        """The first per-process ports of worker `worker_index` of a gang at `peers`."""
        offset = machine_offsets(peers, self.slots)[worker_index]
        return {variable: first + offset for variable, (first, _) in self.per_process().items()}

    def of_one_worker(self, first: int) -> range:
        """The ports of one kind that a worker with a machine of its own binds (a pod): one a slot."""
        return range(first, first + self.slots)

    def on_one_machine(self, world_size: int) -> dict[int, str]:
        """Every port a gang of `world_size` ranks binds when all its workers share one machine
        (`caramel run`), with the field it comes from, for people."""
        ports = {self.rendezvous: "spec.rendezvous.port"}
        for first, field in self.per_process().values():
            for rank in range(world_size):
                ports.setdefault(first + rank, f"{field} (+{rank} for rank {rank})")
        return ports
