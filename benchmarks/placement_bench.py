"""R-Storm placement of a gang against spread and random placements, on synthetic loaded clusters.

    python -m benchmarks.placement_bench                    # 50 to 500 nodes
    python -m benchmarks.placement_bench --nodes 500 --replicas 256

Clusters: racks of RACK_SIZE nodes (32 cores, 128 GiB each), zones of ZONE_RACKS racks. Every
rack has its own background load (a share of each node already requested, drawn per rack,
then per node around it), so racks differ as they do in a busy cluster. The gang's workers
request 4 cores and 16 GiB each.

Placements (R-Storm from `caramel_operator.placement`; the baselines are this module's own):
    rstorm          R-Storm: packs the gang near its reference node; ranks by topology
    spread          Kubernetes' default scheduler: each worker on the freest feasible node, ranks
                    in pod order
    spread-ordered  spread's nodes, ranks re-ordered by topology as R-Storm orders them: the
                    share of the gain that rank order alone brings
    random          each worker on a random feasible node, ranks in pod order

For each: the predicted time of a ring all-reduce of GRADIENT_BYTES (Horovod's algorithm) on the
gang's topology (`caramel.network.labels.gang_topology`: 25 Gbit/s node links, a 100 Gbit/s
uplink per rack, 200 Gbit/s per zone; `caramel.allreduce.simulate`), the bytes that all-reduce
sends between racks, the nodes and racks used, and the time placement took.

Targets (issue 10): R-Storm sends at most half the cross-rack bytes of spread on the loaded
clusters; a 256-worker gang is placed on 500 nodes within a second. The exit status is 1 if
either is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from caramel.allreduce.simulate import ALGORITHMS, bytes_between_groups, predict_seconds
from caramel.network.labels import ClusterLinks, Position, gang_topology
from caramel.network.spec import LinkSpec
from caramel_operator.placement import Cluster, Gang, NodeFree, Placement, ranked_by_topology, rstorm

GiB = 1024**3
RACK_SIZE = 20
ZONE_RACKS = 5
NODE_CPU, NODE_MEMORY = 32.0, 128 * GiB
WORKER = dict(cpu=4.0, memory=16 * GiB)
GRADIENT_BYTES = 100 * 2**20
LINKS = ClusterLinks(
    local=LinkSpec(gbps=100, latency_us=5),
    node=LinkSpec(gbps=25, latency_us=10),
    rack=LinkSpec(gbps=100, latency_us=10),
    zone=LinkSpec(gbps=200, latency_us=100),
)
CROSS_RACK_TARGET = 0.5
SPEED_TARGET_SECONDS = 1.0
SPEED_CASE = (500, 256)


def synthetic_cluster(nodes: int, seed: int) -> list[NodeFree]:
    """`nodes` nodes in racks and zones, each with its share of background load."""
    generator = np.random.default_rng(seed)
    rack_load = generator.uniform(0.1, 0.85, size=-(-nodes // RACK_SIZE))
    cluster = []
    for index in range(nodes):
        rack = index // RACK_SIZE
        zone = f"zone{rack // ZONE_RACKS}"
        load_cpu, load_memory = np.clip(rack_load[rack] + generator.normal(0, 0.12, size=2), 0.0, 0.97)
        cluster.append(
            NodeFree(Position(zone, f"{zone}/rack{rack}", f"node{index:03d}"), NODE_CPU * (1 - load_cpu), NODE_MEMORY * (1 - load_memory))
        )
    return cluster


def spread(nodes: Sequence[NodeFree], gang: Gang) -> Placement:
    """Kubernetes' default scheduler's way: each rank, in order, on the feasible node with the
    most free resources (CPU and memory both hard)."""
    cluster = Cluster(nodes, gang)
    cluster.require(cpu_hard=True)
    chosen = []
    for _ in range(gang.workers):
        feasible = cluster.fits_hard_constraints() & cluster.fits_cpu()
        node = int(np.argmax(np.where(feasible, cluster.free_resources(), -np.inf)))
        cluster.take(node)
        chosen.append(node)
    return Placement(nodes=tuple(cluster.nodes[node].name for node in chosen))


def random_placement(nodes: Sequence[NodeFree], gang: Gang, seed: int = 0) -> Placement:
    """Each rank, in order, on a feasible node drawn at random (CPU and memory both hard)."""
    cluster = Cluster(nodes, gang)
    cluster.require(cpu_hard=True)
    generator = np.random.default_rng(seed)
    chosen = []
    for _ in range(gang.workers):
        node = int(generator.choice(np.flatnonzero(cluster.fits_hard_constraints() & cluster.fits_cpu())))
        cluster.take(node)
        chosen.append(node)
    return Placement(nodes=tuple(cluster.nodes[node].name for node in chosen))


@dataclass(frozen=True)
class Row:
    nodes: int
    replicas: int
    strategy: str
    seconds_to_place: float
    allreduce_seconds: float
    cross_rack_bytes: float
    nodes_used: int
    racks_used: int


STRATEGIES: dict[str, Callable[[list[NodeFree], Gang], Placement]] = {
    "rstorm": rstorm,
    "spread": spread,
    "spread-ordered": lambda cluster, gang: Placement(
        ranked_by_topology(spread(cluster, gang).nodes, {node.name: node.position for node in cluster})
    ),
    "random": lambda cluster, gang: random_placement(cluster, gang, seed=1),
}


def measure(nodes: int, replicas: int, seed: int) -> list[Row]:
    cluster = synthetic_cluster(nodes, seed)
    where = {node.name: node.position for node in cluster}
    gang = Gang(workers=replicas, **WORKER)
    rows = []
    for name, place in STRATEGIES.items():
        started = time.perf_counter()
        placement = place(cluster, gang)
        took = time.perf_counter() - started
        topology = gang_topology([where[node] for node in placement.nodes], LINKS)
        ring = ALGORITHMS["ring"](topology)
        rows.append(
            Row(
                nodes, replicas, name, took,
                predict_seconds("ring", topology, GRADIENT_BYTES),
                bytes_between_groups(ring, topology, GRADIENT_BYTES),
                len(set(placement.nodes)),
                len({where[node].rack for node in placement.nodes}),
            )
        )
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'nodes':>5} {'gang':>5} {'placement':<15} {'place ms':>9} {'ring all-reduce':>16} "
        f"{'cross-rack':>11} {'vs spread':>9} {'nodes':>6} {'racks':>6}"
    )
    print(header)
    print("-" * len(header))
    spread_bytes = {(r.nodes, r.replicas): r.cross_rack_bytes for r in rows if r.strategy == "spread"}
    for r in rows:
        share = r.cross_rack_bytes / spread_bytes[r.nodes, r.replicas] if spread_bytes[r.nodes, r.replicas] else 0.0
        print(
            f"{r.nodes:>5} {r.replicas:>5} {r.strategy:<15} {r.seconds_to_place * 1e3:>9.1f} "
            f"{r.allreduce_seconds * 1e3:>13.1f} ms {r.cross_rack_bytes / 2**30:>7.2f} GiB {share:>8.0%} "
            f"{r.nodes_used:>6} {r.racks_used:>6}"
        )


def check_targets(rows: list[Row]) -> bool:
    by = {(r.nodes, r.replicas, r.strategy): r for r in rows}
    ok = True
    for nodes, replicas, _ in sorted({(r.nodes, r.replicas, 0) for r in rows}):
        ours, theirs = by[nodes, replicas, "rstorm"], by[nodes, replicas, "spread"]
        share = ours.cross_rack_bytes / theirs.cross_rack_bytes if theirs.cross_rack_bytes else 0.0
        holds = share <= CROSS_RACK_TARGET
        ok &= holds
        print(
            f"cross-rack bytes, {nodes} nodes, {replicas} workers: R-Storm {share:.1%} of spread "
            f"(target <= {CROSS_RACK_TARGET:.0%}): {'holds' if holds else 'MISSED'}"
        )
    speed = by.get((*SPEED_CASE, "rstorm"))
    if speed:
        holds = speed.seconds_to_place <= SPEED_TARGET_SECONDS
        ok &= holds
        print(
            f"placement time, {SPEED_CASE[1]} workers on {SPEED_CASE[0]} nodes: {speed.seconds_to_place * 1e3:.0f} ms "
            f"(target <= {SPEED_TARGET_SECONDS * 1e3:.0f} ms): {'holds' if holds else 'MISSED'}"
        )
    return ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="50,100,200,500", help="cluster sizes, comma-separated")
    parser.add_argument("--replicas", default="16,64,128,256", help="gang sizes, comma-separated (those that fit)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the clusters' background load")
    args = parser.parse_args(argv)
    for option in ("nodes", "replicas"):
        text = getattr(args, option)
        try:
            values = sorted(int(value) for value in text.split(","))
        except ValueError:
            parser.error(f"--{option}: expected comma-separated whole numbers, got {text!r}")
        if not values or values[0] < 1:
            parser.error(f"--{option}: values must be at least 1, got {text!r}")
        setattr(args, f"{option}_list", values)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for nodes in args.nodes_list:
        # A gang that fits easily: at most a quarter of what the cluster has free.
        room = sum(int(n.cpu // WORKER["cpu"]) for n in synthetic_cluster(nodes, args.seed))
        for replicas in (r for r in args.replicas_list if r <= room // 4):
            rows += measure(nodes, replicas, args.seed)
    print_table(rows)
    print()
    return 0 if check_targets(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
