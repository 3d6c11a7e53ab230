"""MULTITREE against ring, recursive halving-doubling and a hierarchical all-reduce, simulated.

    python -m benchmarks.topology_sim                       # table, plot, shape check
    python -m benchmarks.topology_sim --sizes 1,64 --plot runs/sim.png

On every standard topology of `caramel.network.synthetic.STANDARD` (2D torus 4x4 and 8x8, a
4x4 mesh, a k=4 fat-tree, two and four racks of 8 hosts behind uplinks at 1/4 of a host link;
100 Gbit/s links, 1 microsecond a hop) and for each all-reduce size, the link-level simulator
(`caramel.allreduce.simulate`: alpha-beta per link, flows sharing a link share its bandwidth)
predicts each algorithm's time. The table gives the times and each algorithm's speedup over the
ring (ring time / its time), the time steps of each phase, and what `auto` would choose.

Shape check against the MULTITREE paper (ISCA 2021), which reports 2.3x over the ring: on the
4x4 torus, at the largest size, MULTITREE must be at least TARGET_SPEEDUP times faster than the
ring. The exit status is 1 if it is not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from caramel.allreduce.simulate import ALGORITHMS, choose_allreduce, predict_seconds
from caramel.network.synthetic import STANDARD

MiB = 2**20
TARGET_SPEEDUP = 2.0
TARGET_TOPOLOGY = "torus-4x4"
DEFAULT_PLOT = Path("runs/topology_sim.png")


def simulate_all(sizes_mib: list[float]) -> dict[str, dict[float, dict[str, float]]]:
    """[topology][size in MiB][algorithm] -> predicted seconds."""
    return {
        name: {
            size: {algorithm: predict_seconds(algorithm, topology, int(size * MiB)) for algorithm in ALGORITHMS}
            for size in sizes_mib
        }
        for name, topology in ((name, make()) for name, make in STANDARD.items())
    }


def print_table(results: dict[str, dict[float, dict[str, float]]]) -> None:
    header = f"{'topology':<12} {'size':>8}  " + "  ".join(f"{name:>22}" for name in ALGORITHMS) + "  auto"
    print(header)
    print("-" * len(header))
    for name, by_size in results.items():
        topology = STANDARD[name]()
        for size, seconds in by_size.items():
            ring = seconds["ring"]
            cells = "  ".join(f"{seconds[a] * 1e3:>12.3f} ms {ring / seconds[a]:>5.2f}x" for a in ALGORITHMS)
            print(f"{name:<12} {size:>5g} MiB  {cells}  {choose_allreduce(topology, int(size * MiB))}")
    print("\ntime steps (reduce-scatter + all-gather):")
    for name in results:
        topology = STANDARD[name]()
        steps = ", ".join(
            f"{a} {s.reduce_scatter_steps}+{s.all_gather_steps}" for a, s in ((a, make(topology)) for a, make in ALGORITHMS.items())
        )
        print(f"  {name:<12} {topology.size:>3} hosts: {steps}")


def plot(results: dict[str, dict[float, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    columns = 3
    rows = -(-len(results) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for axis, (name, by_size) in zip(axes.flat, results.items()):
        sizes = list(by_size)
        for algorithm in ALGORITHMS:
            axis.plot(sizes, [by_size[s]["ring"] / by_size[s][algorithm] for s in sizes], "o-", label=algorithm)
        if name == TARGET_TOPOLOGY:
            axis.axhline(TARGET_SPEEDUP, color="black", linestyle=":", label=f"target {TARGET_SPEEDUP}x")
        axis.set(xscale="log", xlabel="all-reduce size (MiB)", ylabel="speedup over ring", title=name, ylim=(0, None))
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(results) :]:
        axis.set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def shape_check(results: dict[str, dict[float, dict[str, float]]]) -> bool:
    """MULTITREE's speedup over the ring on the 4x4 torus at the largest size, against the target."""
    by_size = results[TARGET_TOPOLOGY]
    largest = max(by_size)
    speedup = by_size[largest]["ring"] / by_size[largest]["multitree"]
    verdict = "holds" if speedup >= TARGET_SPEEDUP else f"MISSED by {TARGET_SPEEDUP - speedup:.2f}x"
    print(
        f"\nshape check: MULTITREE on {TARGET_TOPOLOGY} at {largest:g} MiB is {speedup:.2f}x faster than ring "
        f"(target >= {TARGET_SPEEDUP}x, paper 2.3x): {verdict}"
    )
    return speedup >= TARGET_SPEEDUP


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.0625,1,16,64,256", help="all-reduce sizes in MiB, comma-separated")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help=f"PNG to write (default {DEFAULT_PLOT})")
    args = parser.parse_args(argv)
    try:
        args.size_list = sorted(float(size) for size in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes: expected comma-separated MiB such as 1,64,256, got {args.sizes!r}")
    if not args.size_list or args.size_list[0] <= 0:
        parser.error(f"--sizes: sizes must be positive, got {args.sizes!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = simulate_all(args.size_list)
    print_table(results)
    plot(results, args.plot)
    print(f"\nplot: {args.plot}")
    return 0 if shape_check(results) else 1


if __name__ == "__main__":
    sys.exit(main())
