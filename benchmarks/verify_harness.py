"""Checks of the benchmark harness itself (root, project virtualenv):

    python benchmarks/verify_harness.py tcp [--rates 1000,4000]
        TCP throughput between two emulated workers at each link rate.
    python benchmarks/verify_harness.py allreduce [--workers 4] [--rates 1000,4000]
        Horovod allreduce bus bandwidth of workers launched through Caramel's worker contract.

Both then check that the machine's namespaces, links and iptables rules are as before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.jobrun import RunFailed, bench_job, hostnames, run_job
from benchmarks.netem import DEFAULT_PREFIX, EmulatedCluster, HarnessError, Names

HERE = Path(__file__).resolve().parent
TCP_PORT = 5201
SECONDS = 5


def machine_state() -> dict[str, set[str]]:
    """What cleanup must restore: namespaces, link names and iptables rules."""

    def lines(*argv: str) -> set[str]:
        return set(subprocess.run(argv, capture_output=True, text=True).stdout.splitlines())

    return {
        "namespaces": lines("ip", "netns", "list"),
        "links": {line.split()[0] for line in lines("ip", "-br", "link")},
        "iptables": lines("iptables", "-S"),
    }


def compare_states(before: dict[str, set[str]], after: dict[str, set[str]]) -> bool:
    """Print what changed; True if nothing of ours remains. dockerd may change its own meanwhile."""
    ours_left = False
    for kind in before:
        changed = before[kind] ^ after[kind]
        ours = {item for item in changed if DEFAULT_PREFIX in item}
        ours_left |= bool(ours)
        if ours:
            print(f"cleanup: {kind} of ours LEFT OR REMOVED: {', '.join(sorted(ours))}")
        if changed - ours:
            print(f"cleanup: {kind} changed by others meanwhile (not ours): {', '.join(sorted(changed - ours))}")
    print("cleanup: nothing of ours left" if not ours_left else "cleanup: FAILED")
    return not ours_left


def measure_tcp(rate_mbit: float) -> float:
    with EmulatedCluster(workers=2, rate_mbit=rate_mbit) as cluster:
        probe = [sys.executable, str(HERE / "tcp_probe.py")]
        receiver = cluster.spawn(1, [*probe, "recv", str(TCP_PORT)], {})
        sender = cluster.spawn(0, [*probe, "send", cluster.address(1), str(TCP_PORT), str(SECONDS)], {})
        sent_output, _ = sender.communicate(timeout=SECONDS + 30)
        output, _ = receiver.communicate(timeout=30)
        if sender.returncode or receiver.returncode:
            raise RuntimeError(f"probe failed: {sent_output.decode()} {output.decode()}")
        return json.loads(output.decode().strip().splitlines()[-1])["mbit_per_s"]


def measure_allreduce(workers: int, rate_mbit: float, set_interface: bool) -> list[dict]:
    interface = Names(DEFAULT_PREFIX).interface if set_interface else None
    # A module of the repository (run_job starts workers there), for its import of plain_horovod.
    job = bench_job("probe", [sys.executable, "-m", "benchmarks.allreduce_probe"], workers, interface)
    with tempfile.TemporaryDirectory() as logs, EmulatedCluster(workers, rate_mbit, hostnames=hostnames(job)) as cluster:
        result = run_job(cluster, job, timeout_seconds=300, log_path=Path(logs) / "workers.log")
    return [event for event in result.events if event.get("event") == "allreduce"]


def check(args: argparse.Namespace) -> None:
    for rate in [float(rate) for rate in args.rates.split(",")]:
        if args.check == "tcp":
            print(f"tbf {rate:g} Mbit/s: TCP {measure_tcp(rate):.0f} Mbit/s", flush=True)
            continue
        try:
            events = measure_allreduce(args.workers, rate, not args.no_gloo_iface)
        except RunFailed as failure:
            raise HarnessError(f"tbf {rate:g} Mbit/s: allreduce run failed: {failure}") from None
        for event in events:
            print(
                f"tbf {rate:g} Mbit/s, {args.workers} workers: allreduce {event['megabytes']:.0f} MB "
                f"in {event['seconds']:.3f} s, bus bandwidth {event['bus_mbit_per_s']:.0f} Mbit/s",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["tcp", "allreduce"])
    parser.add_argument("--rates", default="1000,4000", help="link rates in Mbit/s, comma-separated")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-gloo-iface", action="store_true", help="leave HOROVOD_GLOO_IFACE unset")
    args = parser.parse_args()
    before = machine_state()
    try:
        check(args)
    except HarnessError as error:
        print(f"verify_harness: {error}", file=sys.stderr)
        return 2
    return 0 if compare_states(before, machine_state()) else 1


if __name__ == "__main__":
    sys.exit(main())
