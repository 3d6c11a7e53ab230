"""Where the workers of a gang run: R-Storm's resource-aware placement.

A pure function of plain data: the nodes, each with its free resources (allocatable minus what
the pods on it request) and its position (zone, rack), and the gang (replicas and each worker's
requests). It returns a node for each rank, or raises `Unplaceable` naming what is short.

R-Storm (Peng et al., Middleware 2015), applied to a gang of identical workers that all talk to
each other (a ring or trees over every rank):
1. Memory is a hard constraint: a worker goes only on a node whose free memory holds its request,
   and which has a pod slot left (its allocatable `pods` less the pods on it). So are GPUs: a
   worker that asks for some goes only on a node with as many free (a GPU is a device, not a
   share: a node without them can never run it). If the nodes cannot hold the whole gang,
   `Unplaceable` says how many workers fit and which resource is short, for "why is my job
   pending".
2. CPU is a soft constraint, as in R-Storm: a node short of CPU is taken only when no node with
   the memory has the CPU too, and the placement lists it in `cpu_short`. (Kubernetes does
   enforce CPU requests: a worker sent there stays Pending until the CPU frees up.)
3. The first worker goes on R-Storm's reference node: in the rack with the most free resources,
   the node with the most free resources.
4. Each next worker goes on the node that minimises R-Storm's distance
       sqrt((w_mem * dMem)^2 + (w_cpu * dCpu)^2 + (w_net * netDist)^2)
   dMem and dCpu: what the node would have left, as a share of the most any node has free (a
   best fit: a node the worker fills up is close); netDist: the network distance from the node
   to the workers already placed, on average (0 on the same node, 1/3 in the same rack, 2/3 in
   the same zone, 1 farther). R-Storm measures it to the reference node only; measured to every
   placed worker, a gang that outgrows its first rack fills the next rack it entered instead of
   scattering over every rack at the same distance from the first.
5. Ranks follow the topology: workers are numbered zone by zone, rack by rack, node by node, in
   the order placement first used them, so ring neighbours share a node or a rack and a ring
   crosses between racks only once per rack used. On GPU nodes this keeps the ranks of one node
   next to each other, where Horovod's hierarchical allreduce and MULTITREE's trees look for
   the node boundary.

`Cluster` is the nodes as arrays, which the placement benchmark's baselines place on as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from caramel.network.labels import Position

# netDist of each level: same node, same rack, same zone, other zone.
LEVEL_DISTANCES = (0.0, 1 / 3, 2 / 3, 1.0)
GiB = 1024**3


@dataclass(frozen=True)
class NodeFree:
    """A node's free resources and its position."""

    position: Position
    cpu: float
    """Cores free: allocatable minus the requests of the pods on the node."""

    memory: float
    """Bytes free: allocatable minus the requests of the pods on the node."""

    pods: float = math.inf
    """Pods the node may still run: allocatable pods minus the pods on it (inf where not stated)."""

    gpus: float = 0.0
    """GPUs free (nvidia.com/gpu): allocatable minus the pods' on the node."""

    @property
    def name(self) -> str:
        return self.position.node


@dataclass(frozen=True)
class Gang:
    """The workers to place: how many, and what each requests."""

    workers: int
    cpu: float
    """Cores each worker requests."""

    memory: float
    """Bytes each worker requests."""

    gpus: float = 0.0
    """GPUs each worker asks for."""


@dataclass(frozen=True)
class Weights:
    """R-Storm's weights. Network distance weighs most: one level farther (another rack) costs as
    much as the widest possible difference of fit in one resource."""

    memory: float = 1.0
    cpu: float = 1.0
    network: float = 3.0


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]
    """The node of each rank."""

    cpu_short: tuple[str, ...] = ()
    """Nodes given more CPU than they have free (CPU is soft in R-Storm)."""


class Unplaceable(Exception):
    """The gang does not fit; the message says which resource is short (why the job is pending)."""


class Cluster:
    """The nodes as arrays (sorted by name, so that results do not depend on the input's order)."""

    def __init__(self, nodes: Sequence[NodeFree], gang: Gang) -> None:
        if gang.workers < 1:
            raise ValueError(f"a gang has at least one worker, got workers={gang.workers}")
        self.nodes = sorted(nodes, key=lambda node: node.name)
        self.gang = gang
        self.cpu = np.array([node.cpu for node in self.nodes], dtype=np.float64)
        self.memory = np.array([node.memory for node in self.nodes], dtype=np.float64)
        self.pods = np.array([node.pods for node in self.nodes], dtype=np.float64)
        self.gpus = np.array([node.gpus for node in self.nodes], dtype=np.float64)
        self.rack = _codes([node.position.rack for node in self.nodes])
        self.zone = _codes([node.position.zone for node in self.nodes])
        self.scale_cpu = max(float(self.cpu.max(initial=0.0)), gang.cpu, 1e-9)
        self.scale_memory = max(float(self.memory.max(initial=0.0)), gang.memory, 1.0)

    def fits_hard_constraints(self) -> np.ndarray:
        """Where a worker's memory and GPUs fit and a pod slot is left: the hard constraints."""
        return (self.memory >= self.gang.memory) & (self.pods >= 1) & (self.gpus >= self.gang.gpus)

    def fits_cpu(self) -> np.ndarray:
        return self.cpu >= self.gang.cpu

    def free_resources(self) -> np.ndarray:
        """Free CPU and memory, each as a share of the most any node has."""
        return self.cpu / self.scale_cpu + self.memory / self.scale_memory

    def take(self, node: int) -> None:
        self.cpu[node] -= self.gang.cpu
        self.memory[node] -= self.gang.memory
        self.pods[node] -= 1
        self.gpus[node] -= self.gang.gpus

    def distances_from(self, node: int) -> np.ndarray:
        """netDist from `node` to every node."""
        same_node, same_rack, same_zone, farther = LEVEL_DISTANCES
        return np.where(
            np.arange(len(self.nodes)) == node,
            same_node,
            np.where(self.rack == self.rack[node], same_rack, np.where(self.zone == self.zone[node], same_zone, farther)),
        )

    def holds(self, cpu_hard: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Workers each node holds (by memory, GPUs and pod slots, and CPU where hard), and those
        its free memory, free CPU, free pod slots and free GPUs each hold."""
        gang = self.gang
        by_memory = np.floor(self.memory / gang.memory) if gang.memory > 0 else np.full(len(self.nodes), np.inf)
        by_cpu = np.floor(self.cpu / gang.cpu) if gang.cpu > 0 else np.full(len(self.nodes), np.inf)
        by_pods = np.maximum(self.pods, 0)
        by_gpus = np.floor(self.gpus / gang.gpus) if gang.gpus > 0 else np.full(len(self.nodes), np.inf)
        room = np.minimum(np.minimum(np.minimum(by_memory, by_cpu) if cpu_hard else by_memory, by_pods), by_gpus)
        return room, by_memory, by_cpu, by_pods, by_gpus

    def require(self, cpu_hard: bool) -> None:
        """Raise Unplaceable unless the nodes can hold the whole gang."""
        gang = self.gang
        room, by_memory, by_cpu, by_pods, by_gpus = self.holds(cpu_hard)
        if room.sum(initial=0) >= gang.workers:
            return
        gpus = f", {gang.gpus:g} GPU" if gang.gpus else ""
        wanted = f"{gang.workers} workers (each {_cores(gang.cpu)} CPU, {_gib(gang.memory)} memory{gpus})"
        if not self.nodes:
            raise Unplaceable(f"cannot place {wanted}: no schedulable node")
        short = []
        if by_memory.sum() < gang.workers:
            best = int(np.argmax(self.memory))
            short.append(
                f"memory: free memory holds {int(by_memory.sum())} of them "
                f"(most free: {_gib(self.memory[best])} on {self.nodes[best].name})"
            )
        if cpu_hard and by_cpu.sum() < gang.workers:
            best = int(np.argmax(self.cpu))
            short.append(
                f"cpu: free CPU holds {int(by_cpu.sum())} of them (most free: {_cores(self.cpu[best])} on {self.nodes[best].name})"
            )
        if by_pods.sum() < gang.workers:
            short.append(f"pods: the nodes have room for {int(by_pods.sum())} more pods (allocatable pods)")
        if by_gpus.sum() < gang.workers:
            best = int(np.argmax(self.gpus))
            short.append(
                f"GPUs: free nvidia.com/gpu holds {int(by_gpus.sum())} of them (most free: {self.gpus[best]:g} on {self.nodes[best].name})"
            )
        if not short:  # each resource alone would do, but not on the same nodes
            short.append(f"cpu and memory: nodes with both free hold {int(room.sum())} of them")
        raise Unplaceable(f"cannot place {wanted}; short of {'; '.join(short)}")


def largest_fit(nodes: Sequence[NodeFree], gang: Gang, min_workers: int) -> int:
    """How many workers to place, from `min_workers` up to the gang's workers: the most whose memory,
    GPUs, pod slots and CPU the nodes all hold, so that a gang allowed to run smaller
    (spec.workers.minReplicas) runs with workers that all start; `min_workers` where not even that many
    get their CPU, which R-Storm may still place (CPU is soft) or say what is short."""
    room, *_ = Cluster(nodes, gang).holds(cpu_hard=True)
    return max(min_workers, int(min(gang.workers, room.sum(initial=0))))  # a node stating no limits holds any number


def rstorm(nodes: Sequence[NodeFree], gang: Gang, weights: Weights = Weights()) -> Placement:
    """R-Storm's placement of the gang, ranks ordered by topology (see the module's docstring)."""
    cluster = Cluster(nodes, gang)
    cluster.require(cpu_hard=False)
    chosen: list[int] = []
    distance_sum = np.zeros(len(cluster.nodes))
    for placed in range(gang.workers):
        candidates = cluster.fits_hard_constraints()
        if (candidates & cluster.fits_cpu()).any():
            candidates &= cluster.fits_cpu()
        if placed == 0:
            node = _reference_node(cluster, candidates)
        else:
            fit_memory = (cluster.memory - gang.memory) / cluster.scale_memory
            fit_cpu = (cluster.cpu - gang.cpu) / cluster.scale_cpu
            network = distance_sum / placed
            distance = (
                (weights.memory * fit_memory) ** 2 + (weights.cpu * fit_cpu) ** 2 + (weights.network * network) ** 2
            )
            node = int(np.argmin(np.where(candidates, distance, np.inf)))
        cluster.take(node)
        distance_sum += cluster.distances_from(node)
        chosen.append(node)
    short = sorted({cluster.nodes[node].name for node in chosen if cluster.cpu[node] < 0})
    names = [cluster.nodes[node].name for node in chosen]
    positions = {node.name: node.position for node in cluster.nodes}
    return Placement(nodes=ranked_by_topology(names, positions), cpu_short=tuple(short))


def _reference_node(cluster: Cluster, candidates: np.ndarray) -> int:
    """In the rack with the most free resources, the node with the most free resources."""
    free = np.where(candidates, cluster.free_resources(), 0.0)
    rack_free = np.bincount(cluster.rack, weights=free)
    in_rack = candidates & (cluster.rack == int(np.argmax(rack_free)))
    return int(np.argmax(np.where(in_rack, free, -np.inf)))


def ranked_by_topology(nodes: Sequence[str], positions: Mapping[str, Position]) -> tuple[str, ...]:
    """The ranks' nodes re-ordered zone by zone, rack by rack, node by node, each in the order the
    ranks first used it: neighbours in the new order share a node or a rack wherever they can."""
    first_use: dict[tuple[str, str], int] = {}
    for order, name in enumerate(nodes):
        where = positions[name]
        for level in (("zone", where.zone), ("rack", where.rack), ("node", name)):
            first_use.setdefault(level, order)

    def key(name: str) -> tuple[int, int, int]:
        where = positions[name]
        return first_use["zone", where.zone], first_use["rack", where.rack], first_use["node", name]

    return tuple(sorted(nodes, key=key))


def _codes(values: list[str]) -> np.ndarray:
    """Each value's number among the distinct values."""
    numbers: dict[str, int] = {}
    return np.array([numbers.setdefault(value, len(numbers)) for value in values], dtype=np.int64)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.3g}Gi"


def _cores(cores: float) -> str:
    return f"{cores:.3g}"
