"""Horovod's ring against Caramel's MULTITREE on emulated racks (and on a flat network).

    python -m benchmarks.topology_bench                     # 8 workers, 1000 Mbit/s links, 3 repeats
    python -m benchmarks.topology_bench --workers 4 --sizes 64,256 --testbeds racks

Method. `netem.EmulatedCluster` puts every worker in its own network namespace. On the racks
testbed the first half of the workers is on one bridge and the rest on another, the bridges
joined by one uplink at a quarter of the host links' rate (`--uplink-ratio`), shaped in both
directions; the flat testbed has every worker on one bridge. Each worker is started through
Caramel's worker contract (`jobrun.py`), with the testbed's topology in CARAMEL_TOPOLOGY (set
through spec.env: `run_job` takes no topology), and runs `topology_worker.py`: in every repeat,
on the same random float32 buffers, Horovod's allreduce (Gloo's ring, Horovod's defaults) and
Caramel's `TreeTransport` on `multitree(topology)`, the slowest rank's time counting.

Bounds. On the racks testbed every byte of the buffer has to cross the uplink once in each
direction (each rack needs the other's sum), so no all-reduce of B bytes beats B / uplink rate;
a ring crosses it with 2 (N - 1) / N x B. On the flat testbed every host link carries at least
2 (N - 1) / N x B in each direction. `auto` is what `spec.caramel.allreduce: auto` picks
(`choose_allreduce` on the testbed's topology); its time is that algorithm's.

TCP. Horovod's connections use the machine's default congestion control; the transport's use
`CONGESTION_CONTROL` (cubic) where the system allows it, or what `--congestion-control` names
(`system`: the default, as Horovod's).

The table gives, per testbed and size, each algorithm's median and min-max spread over the
repeats, ring / multitree (a speedup above 1), the bound and multitree / bound.

--model PROFILE (an emulated profile: resnet50, vgg16, bert_base) then trains that model end to
end on each testbed through the public API as `make bench` does (`emulated_worker.py`), once per
repeat and algorithm: plain Horovod's defaults (its tape in a tf.function per step; its Keras fit
needs Keras 2), and Caramel through Keras fit on Horovod's collectives with spec.caramel.allreduce
ring, multitree and auto. The second table gives each one's median step.
On the flat testbed `auto` has to choose ring and be no slower than it.

Logs and results.json go to runs/topology-bench-<time>/. Needs root; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from caramel.allreduce.simulate import choose_allreduce
from caramel.collectives.tree_transport import CONGESTION_CONTROL, PIECE_BYTES
from caramel.network.model import Link, Topology
from caramel.network.wire import to_json

from benchmarks.jobrun import REPOSITORY, RunFailed, bench_job, hostnames, run_job
from benchmarks.netem import EmulatedCluster, HarnessError, rack_of
from benchmarks.profiles import NAMES as PROFILES
from benchmarks.scheduling_bench import collect
from benchmarks.workloads import make_workloads, warmup_steps

PREFIX = "crtp"
SUBNET = "10.213.9.0/24"
MEGABYTE = 2**20
TESTBEDS = ("racks", "flat")
# The model runs: (label, the worker's strategy, its API, spec.caramel). Horovod is plain Horovod's
# tape in a tf.function per step (its Keras fit needs Keras 2); Caramel trains with Keras fit on
# Horovod's collectives, whose ring the trees replace.
MODEL_ALGORITHMS: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("horovod", "horovod", "tape", {}),
    ("caramel ring", "caramel", "fit", {"backend": "horovod", "allreduce": "ring"}),
    ("caramel multitree", "caramel", "fit", {"backend": "horovod", "allreduce": "multitree"}),
    ("caramel auto", "caramel", "fit", {"backend": "horovod", "allreduce": "auto"}),
)


def testbed_topology(testbed: str, workers: int, rate_mbit: float, uplink_mbit: float) -> Topology:
    """The emulated network as a Topology, rank i on worker i: what the workers plan trees on."""
    hosts = tuple(f"w{index}" for index in range(workers))
    bandwidth = rate_mbit * 1e6 / 8
    if testbed == "flat":
        return Topology(hosts, ("bridge",), tuple(Link(host, "bridge", bandwidth) for host in hosts))
    racks = [f"rack{rack_of(index, workers, 2)}" for index in range(workers)]
    links = [Link(host, rack, bandwidth) for host, rack in zip(hosts, racks)]
    return Topology(hosts, ("rack0", "rack1"), (*links, Link("rack0", "rack1", uplink_mbit * 1e6 / 8)))


def bound_seconds(testbed: str, workers: int, nbytes: float, rate_mbit: float, uplink_mbit: float) -> float:
    """What no all-reduce of nbytes can beat on the testbed (see the module's docstring)."""
    if testbed == "racks":
        return nbytes / (uplink_mbit * 1e6 / 8)
    return 2 * (workers - 1) / workers * nbytes / (rate_mbit * 1e6 / 8)


def run_testbed(args: argparse.Namespace, testbed: str, directory: Path) -> list[dict]:
    """The all-reduce runs on one testbed and, with --model, the model's training runs."""
    uplink = args.rate / args.uplink_ratio
    topology = testbed_topology(testbed, args.workers, args.rate, uplink)
    env = {"CARAMEL_TOPOLOGY": to_json(topology)}
    command = [
        sys.executable, "-m", "benchmarks.topology_worker", "--sizes", args.sizes, "--repeats", str(args.repeats),
        "--piece-bytes", str(args.piece_kib * 1024), "--congestion-control", args.congestion_control,
    ]  # fmt: skip
    job = bench_job(f"topology-{testbed}", command, args.workers, f"{PREFIX}-eth", env=env)
    # Generous: the ring at its bound on the uplink, twice over, for every run, plus start-up.
    total_bytes = sum(int(size) for size in args.sizes.split(",")) * MEGABYTE * (2 * args.repeats + 2)
    timeout = 180 + 4 * total_bytes / (uplink * 1e6 / 8)
    racks = 2 if testbed == "racks" else 1
    with EmulatedCluster(
        args.workers, args.rate, prefix=PREFIX, subnet=SUBNET, hostnames=hostnames(job),
        racks=racks, uplink_rate_mbit=uplink if racks > 1 else None,
    ) as cluster:  # fmt: skip
        print(f"--- {testbed}: {args.workers} workers, links {args.rate:g} Mbit/s"
              + (f", uplink {uplink:g} Mbit/s" if racks > 1 else ""), flush=True)
        result = run_job(cluster, job, timeout, directory / f"{testbed}.log", on_event=lambda event: print(
            f"    {json.dumps(event)}", flush=True))
        model_events = run_model(args, testbed, cluster, env, uplink, directory) if args.model else []
    events = [{**event, "testbed": testbed} for event in result.events if event.get("event") in ("allreduce", "check")]
    sizes = len(args.sizes.split(","))
    if len(events) != sizes * (2 * args.repeats + 1):
        # Workers that exit 0 with results missing fail nothing: count what came.
        raise RunFailed(f"{testbed}: {len(events)} of {sizes * (2 * args.repeats + 1)} results came; see {directory}")
    for event in events:
        if event["event"] == "allreduce":
            nbytes = event["megabytes"] * MEGABYTE
            event["auto"] = choose_allreduce(topology, nbytes)
            event["bound_seconds"] = bound_seconds(testbed, args.workers, nbytes, args.rate, uplink)
    return events + model_events


def run_model(
    args: argparse.Namespace, testbed: str, cluster: EmulatedCluster, env: dict[str, str], uplink: float, directory: Path
) -> list[dict]:
    """--model trained end to end on the testbed by each of MODEL_ALGORITHMS, the repeats interleaved."""
    (workload,) = make_workloads("emulated", [args.model])
    # Generous: start-up and tracing, plus every step at ten times compute and a ring over the uplink.
    step = workload.compute_seconds + 2 * workload.gradient_bytes / (uplink * 1e6 / 8)
    warmup = warmup_steps(args.steps_per_execution)
    timeout = 300 + 10 * (warmup + args.model_steps) * step
    events = []
    for repeat in range(args.repeats):
        for label, strategy, api, caramel in MODEL_ALGORITHMS:
            command = workload.command(strategy, api, args.model_steps, warmup, args.steps_per_execution)
            # The cluster maps the hostnames of the all-reduce job: the model jobs take its name.
            job = bench_job(f"topology-{testbed}", command, args.workers, f"{PREFIX}-eth", env, caramel)
            log = directory / f"{testbed}-{args.model}-{label.replace(' ', '-')}-{repeat}.log"
            print(f"--- {testbed}: {args.model} trained by {label} (run {repeat + 1})", flush=True)
            run = collect(run_job(cluster, job, timeout, log).events)
            print(f"    median step {run.step_seconds:.3f} s", flush=True)
            events.append({"event": "model", "testbed": testbed, "algorithm": label, "seconds": run.step_seconds,
                           "allreduce": run.details.get("allreduce")})  # fmt: skip
    return events


def default_congestion_control() -> str:
    """The machine's TCP congestion control, which Horovod's Gloo connections use."""
    return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def table(events: list[dict]) -> str:
    rows = [
        "| testbed | MiB | ring s (min-max) | multitree s (min-max) | ring / multitree | bound s | multitree / bound "
        "| ring / bound | auto | max abs difference |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    checks = {(e["testbed"], e["megabytes"]): e["max_difference"] for e in events if e["event"] == "check"}
    runs = [e for e in events if e["event"] == "allreduce"]
    for testbed, megabytes in dict.fromkeys((e["testbed"], e["megabytes"]) for e in runs):
        mine = [e for e in runs if (e["testbed"], e["megabytes"]) == (testbed, megabytes)]
        times = {name: [e["seconds"] for e in mine if e["algorithm"] == name] for name in ("ring", "multitree")}
        median = {name: statistics.median(seconds) for name, seconds in times.items()}
        bound = mine[0]["bound_seconds"]
        spread = {name: f"{median[name]:.3f} ({min(s):.3f}-{max(s):.3f})" for name, s in times.items()}
        rows.append(
            f"| {testbed} | {megabytes} | {spread['ring']} | {spread['multitree']} | "
            f"{median['ring'] / median['multitree']:.2f} | {bound:.3f} | {median['multitree'] / bound:.2f} | "
            f"{median['ring'] / bound:.2f} | {mine[0]['auto']} | {checks.get((testbed, megabytes), float('nan')):.1e} |"
        )
    return "\n".join(rows)


def model_table(events: list[dict], model: str) -> str:
    rows = [
        f"| testbed | {model}: step s (min-max) | " + " | ".join(label for label, _, _, _ in MODEL_ALGORITHMS[1:])
        + " | horovod / multitree | ring / auto | auto chose |",
        "| --- | --- | " + " | ".join("---" for _ in MODEL_ALGORITHMS[1:]) + " | ---: | ---: | --- |",
    ]  # fmt: skip
    runs = [e for e in events if e["event"] == "model"]
    for testbed in dict.fromkeys(e["testbed"] for e in runs):
        times = {label: [e["seconds"] for e in runs if (e["testbed"], e["algorithm"]) == (testbed, label)]
                 for label, _, _, _ in MODEL_ALGORITHMS}  # fmt: skip
        median = {label: statistics.median(seconds) for label, seconds in times.items()}
        cells = [f"{median[label]:.3f} ({min(s):.3f}-{max(s):.3f})" for label, s in times.items()]
        rows.append(
            f"| {testbed} | horovod {cells[0]} | " + " | ".join(cells[1:])
            + f" | {median['horovod'] / median['caramel multitree']:.2f}"
            + f" | {median['caramel ring'] / median['caramel auto']:.2f}"
            + f" | {', '.join(sorted({str(e['allreduce']) for e in runs if (e['testbed'], e['algorithm']) == (testbed, 'caramel auto')}))} |"
        )  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="workers (ranks), split evenly over the two racks")
    parser.add_argument("--rate", type=float, default=1000, help="host link rate, Mbit/s")
    parser.add_argument("--uplink-ratio", type=float, default=4, help="host link rate / uplink rate")
    parser.add_argument("--sizes", default="4,16,64,128,256", help="buffer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--testbeds", default=",".join(TESTBEDS), help="racks, flat, or both")
    parser.add_argument("--piece-kib", type=int, default=PIECE_BYTES // 1024, help="the transport's piece size, KiB")
    parser.add_argument(
        "--congestion-control", default=CONGESTION_CONTROL,
        help="TCP congestion control of the transport's connections; 'system' keeps the machine's default, which "
        "Horovod's connections always use",
    )  # fmt: skip
    parser.add_argument("--model", help="also train this emulated profile end to end on each testbed (resnet50, ...)")
    parser.add_argument("--model-steps", type=int, default=16, help="measured steps of each model run")
    parser.add_argument("--steps-per-execution", type=int, default=4, help="Keras' steps_per_execution of the model runs")
    args = parser.parse_args(argv)
    testbeds = args.testbeds.split(",")
    problems = [f"--testbeds: unknown testbed {name!r} (known: {', '.join(TESTBEDS)})" for name in testbeds
                if name not in TESTBEDS]
    if args.workers < 2:
        problems.append(f"--workers: at least 2, got {args.workers}")
    if args.model and args.model not in PROFILES:
        problems.append(f"--model: unknown profile {args.model!r} (known: {', '.join(PROFILES)})")
    if min(args.model_steps, args.steps_per_execution) < 1:
        problems.append("--model-steps and --steps-per-execution must be at least 1")
    if min(args.rate, args.uplink_ratio, args.repeats, args.piece_kib) <= 0:
        problems.append("--rate, --uplink-ratio, --repeats and --piece-kib must be positive")
    try:
        if any(int(size) < 1 for size in args.sizes.split(",")):
            problems.append(f"--sizes: every size must be at least 1 MiB, got {args.sizes}")
    except ValueError:
        problems.append(f"--sizes: whole numbers of MiB separated by commas, got {args.sizes!r}")
    if problems:
        parser.error("; ".join(problems))
    directory = REPOSITORY / "runs" / time.strftime("topology-bench-%Y%m%d-%H%M%S")
    directory.mkdir(parents=True)
    events: list[dict] = []
    try:
        for testbed in testbeds:
            events += run_testbed(args, testbed, directory)
    except (RunFailed, HarnessError) as error:
        print(f"topology benchmark failed: {error}", file=sys.stderr)
        return 1
    finally:
        (directory / "results.json").write_text(json.dumps({"args": vars(args), "events": events}, indent=1))
    print(f"\n{args.workers} workers, links {args.rate:g} Mbit/s, uplink {args.rate / args.uplink_ratio:g} Mbit/s, "
          f"{args.repeats} repeats, pieces of {args.piece_kib} KiB, transport congestion control "
          f"{args.congestion_control} (machine default {default_congestion_control()}); seconds are the slowest rank's\n")
    print(table(events))
    if args.model:
        print(f"\n{args.model} trained end to end (Horovod's tape, Caramel's Keras fit), median step over {args.model_steps} steps, "
              f"median (min-max) of {args.repeats} runs\n")
        print(model_table(events, args.model))
    print(f"\nlogs and results.json in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
