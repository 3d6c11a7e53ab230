"""An emulated cluster on one machine: one network namespace per worker, shaped links, a bridge.

    with EmulatedCluster(workers=4, rate_mbit=4000, hostnames=names) as cluster:
        process = cluster.spawn(0, argv, env)      # runs inside worker 0's namespace
        cluster.set_rate(1000)                     # a live rate drop

    with EmulatedCluster(workers=8, rate_mbit=1000, racks=2, uplink_rate_mbit=250) as cluster:
        ...                                        # workers 0-3 in rack 0, 4-7 in rack 1

Topology: every worker namespace `<prefix>-w<i>` has one veth, `<prefix>-eth` inside (the same
name everywhere, so one `HOROVOD_GLOO_IFACE` fits every worker) and `<prefix>-h<i>` on the
host, enslaved to the bridge `<prefix>-br`. A `tbf` qdisc at the link rate sits on BOTH ends
of every veth: the namespace end shapes what the worker sends, the host end what it receives,
so every worker has a full-duplex link of that rate to a non-blocking switch. (This kernel has
no `netem`: no delay or loss emulation, only rate.)

Racks (`racks=2`): the workers are split into two racks of consecutive workers, each on
its own bridge `<prefix>-br<rack>`, and the two bridges are joined by one uplink, a veth pair
`<prefix>-u0` (on rack 0's bridge) - `<prefix>-u1` (on rack 1's), shaped with `tbf` at
`uplink_rate_mbit` on both ends: u0's egress is what rack 0 sends to rack 1, u1's the way back.
Every worker stays in one /24, so addresses and hosts files are as with one bridge.

Horovod's Gloo contexts resolve the worker's own hostname, so every worker also gets its own
UTS and mount namespace (`unshare -u -m`) with its hostname set and a hosts file, mapping
every worker's hostname to its veth address, bind-mounted over /etc/hosts.

Nothing outside what this module creates is touched: every name carries the prefix, the
addresses come from a private /24 that must not overlap a route of the host, and the only
host-wide change, an iptables ACCEPT rule for traffic within each of our bridges (dockerd sets
the FORWARD policy to DROP, and bridged frames pass through iptables here), is removed again.
Everything created is undone in reverse order on normal exit, on an exception and on
SIGINT/SIGTERM/SIGHUP. After a SIGKILL of the harness, its processes die with it (parent-death
signal) and `python benchmarks/netem.py --cleanup` removes the rest.

Run as root, with the project's virtualenv: `python benchmarks/netem.py --help`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, cast

from caramel.launch.processes import spawn as spawn_process
from caramel.launch.processes import stop_groups

DEFAULT_PREFIX = "crml"
DEFAULT_SUBNET = "10.213.7.0/24"
# Linux interface names have at most 15 characters; `<prefix>-h<index>` is the longest we make.
MAX_PREFIX_LENGTH = 8
RACKS = (1, 2)
"""Racks the cluster can have: one bridge, or two bridges joined by one uplink."""
NETNS_DIR = Path("/run/netns")
# Runs inside the worker's new UTS and mount namespaces, then becomes the worker's command.
ENTER_WORKER_NAMESPACES = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


class HarnessError(Exception):
    """The emulated cluster cannot be built or a command of it failed; the message says which."""


def tbf_parameters(rate_mbit: float) -> list[str]:
    """tc arguments of the token bucket that shapes one direction of one link at rate_mbit.

    burst: 1 ms worth of the rate, at least 64 KiB. veth passes GSO super-packets of up to
    64 KiB; a bucket smaller than one would make tbf split them (CPU we do not have to spare,
    Gloo shares our 2 cores). 1 ms of bursting at full speed is negligible against transfers
    of megabytes, yet large enough that the kernel's timer wakes up at most ~1000 times a
    second per link at high rates.
    latency: 10 ms of queue (limit = rate x 10 ms + burst). Each sender's own tbf holds its TCP
    back through TCP small queues, so queues only build where several senders converge on one
    receiver; 10 ms absorbs that without drops, while an RTT inflated by at most 10 ms stays
    far below any step time measured here.
    """
    rate_bytes_per_second = rate_mbit * 1e6 / 8
    burst_bytes = max(64 * 1024, int(rate_bytes_per_second * 1e-3))
    return ["rate", f"{rate_mbit:g}mbit", "burst", str(burst_bytes), "latency", "10ms"]


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise HarnessError(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def rack_of(index: int, workers: int, racks: int) -> int:
    """The rack of worker `index`: racks of consecutive workers, the first ones the larger."""
    return index * racks // workers


class Names:
    """The names of everything a cluster with this prefix creates."""

    def __init__(self, prefix: str) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,%d}" % (MAX_PREFIX_LENGTH - 1), prefix):
            raise HarnessError(f"prefix {prefix!r}: use 1 to {MAX_PREFIX_LENGTH} lowercase letters and digits")
        self.prefix = prefix
        self.interface = f"{prefix}-eth"
        self.rule_comment = f"{prefix}: caramel emulated cluster"

    def bridges(self, racks: int) -> list[str]:
        """One bridge per rack: `<prefix>-br` alone, or `<prefix>-br0`, `<prefix>-br1`, ..."""
        return [f"{self.prefix}-br"] if racks == 1 else [f"{self.prefix}-br{rack}" for rack in range(racks)]

    def uplink(self, end: int) -> str:
        """End `end` of the uplink veth pair: 0 on rack 0's bridge, 1 on rack 1's."""
        return f"{self.prefix}-u{end}"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}-w{index}"

    def host_veth(self, index: int) -> str:
        return f"{self.prefix}-h{index}"

    def forward_rule(self, bridge: str) -> list[str]:
        """The iptables FORWARD rule (without -I/-D) accepting traffic within one of our bridges only."""
        return ["-i", bridge, "-o", bridge, "-m", "comment", "--comment", self.rule_comment, "-j", "ACCEPT"]

    def existing(self) -> dict[str, list[str]]:
        """What with these names exists now on this machine: namespaces, links and iptables rules."""
        own_link = re.compile(rf"{re.escape(self.prefix)}-(br\d*|h\d+|u\d)")
        own_namespace = re.compile(rf"{re.escape(self.prefix)}-w\d+")
        links = [link["ifname"] for link in json.loads(_run(["ip", "-j", "link", "show"]).stdout or "[]")]
        namespaces = [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]
        rules = _run(["iptables", "-S", "FORWARD"]).stdout.splitlines()
        return {
            "namespaces": [name for name in namespaces if own_namespace.fullmatch(name)],
            "links": [name for name in links if own_link.fullmatch(name)],
            "rules": [rule for rule in rules if self.rule_comment in rule],
        }


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL whatever still runs inside one of our namespaces: only we started processes there."""
    pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    # Deleting the namespace destroys its veth end, and with it the host end of the pair.
    _run(["ip", "netns", "delete", namespace])


def _delete_link_if_present(name: str) -> None:
    if _run(["ip", "link", "show", name], check=False).returncode == 0:
        _run(["ip", "link", "delete", name])


def remove_leftovers(prefix: str) -> list[str]:
    """Remove what an earlier cluster with this prefix left behind (its harness was SIGKILLed)."""
    names = Names(prefix)
    existing = names.existing()
    for namespace in existing["namespaces"]:
        _delete_namespace(namespace)
    for link in existing["links"]:
        _delete_link_if_present(link)
    for rule in existing["rules"]:  # as `iptables -S` prints it: -A FORWARD <the rule>
        _run(["iptables", "-D", *shlex.split(rule)[1:]])
    if existing["namespaces"]:
        _remove_netns_dir_if_unused()  # most likely made by the killed harness's `ip netns add`
    directories = list(Path(tempfile.gettempdir()).glob(f"{prefix}-netem-*"))  # hosts files
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    return [item for group in existing.values() for item in group] + [str(d) for d in directories]


class EmulatedCluster:
    """`workers` namespaces linked at `rate_mbit` through one bridge, or through two bridges
    (`racks=2`) joined by an uplink of `uplink_rate_mbit`; a context manager."""

    def __init__(
        self,
        workers: int,
        rate_mbit: float,
        prefix: str = DEFAULT_PREFIX,
        subnet: str = DEFAULT_SUBNET,
        hostnames: Sequence[str] | None = None,
        racks: int = 1,
        uplink_rate_mbit: float | None = None,
    ) -> None:
        self.names = Names(prefix)
        self.subnet = ipaddress.IPv4Network(subnet)
        if self.subnet.prefixlen != 24 or not self.subnet.is_private:
            raise HarnessError(f"subnet {subnet}: use a private /24")
        if not 1 <= workers <= 253:
            raise HarnessError(f"workers: {workers} is outside 1..253")
        if rate_mbit <= 0:
            raise HarnessError(f"rate_mbit must be positive, got {rate_mbit}")
        if racks not in RACKS:
            raise HarnessError(f"racks: {racks} is not one of {', '.join(map(str, RACKS))}")
        if racks > workers:
            raise HarnessError(f"racks: {racks} racks need at least as many workers, got {workers}")
        if (racks > 1) != (uplink_rate_mbit is not None):
            raise HarnessError("uplink_rate_mbit: give it exactly when there are several racks")
        if uplink_rate_mbit is not None and uplink_rate_mbit <= 0:
            raise HarnessError(f"uplink_rate_mbit must be positive, got {uplink_rate_mbit}")
        self.racks = racks
        self.uplink_rate_mbit = uplink_rate_mbit
        self.bridges = self.names.bridges(racks)
        self.workers = workers
        self.rate_mbit = rate_mbit
        self.hostnames = list(hostnames) if hostnames else [self.names.namespace(i) for i in range(workers)]
        if len(self.hostnames) != workers:
            raise HarnessError(f"expected {workers} hostnames, got {len(self.hostnames)}")
        self._undo: list[tuple[str, Callable[[], object]]] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self._directory: Path | None = None
        self._closing = False
        self._deferred_signal: int | None = None
        self._previous_handlers: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}

    # -- what callers use ------------------------------------------------------------------

    @property
    def interface(self) -> str:
        """The name of the worker's network interface inside every namespace."""
        return self.names.interface

    def address(self, index: int) -> str:
        self._check_index(index)
        return str(self.subnet.network_address + index + 1)

    def rack(self, index: int) -> int:
        """The rack of worker `index` (`rack_of`)."""
        self._check_index(index)
        return rack_of(index, self.workers, self.racks)

    @property
    def bridge_address(self) -> str:
        """The host's address on the cluster's subnet (on rack 0's bridge)."""
        return str(self.subnet.network_address + 254)

    def set_rate(self, rate_mbit: float) -> None:
        """Change the shaping of every worker's link, both directions, while traffic flows (the
        uplink keeps its rate)."""
        for index in range(self.workers):
            self._shape(index, rate_mbit, "replace")
        self.rate_mbit = rate_mbit

    def spawn(
        self,
        index: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        hostname: str | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start argv inside worker index's namespaces, stdout and stderr merged into one pipe.

        The process runs in its own process group, dies with this process (parent-death
        signal) and is stopped, with its group, when the cluster closes.
        """
        self._check_index(index)
        if hostname is not None and hostname != self.hostnames[index]:
            raise HarnessError(
                f"worker {index}: hostname {hostname!r} is not {self.hostnames[index]!r}, the name the hosts file maps"
            )
        assert self._directory is not None, "spawn() needs an entered cluster"
        command = [
            "ip", "netns", "exec", self.names.namespace(index),
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", ENTER_WORKER_NAMESPACES, "caramel-netem",
            self.hostnames[index], str(self._directory / "hosts"), *argv,
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", os.defpath), **env}
        process = spawn_process(command, env, cwd=str(cwd) if cwd else None)
        self._processes.append(process)
        return process

    def stop_processes(self) -> None:
        """Stop every process spawned here that still runs, then anything left in our namespaces.

        Only processes not yet reaped are signalled (poll() is None), so a PID the kernel has
        recycled for someone else's process is never hit.
        """
        running = [process for process in self._processes if process.poll() is None]
        stop_groups(running, grace_seconds=10)
        self._processes.clear()
        for index in range(self.workers):
            _kill_namespace_processes(self.names.namespace(index))  # nothing if not created yet

    # -- building and tearing down -----------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self._install_signal_handlers()
        try:
            self._preflight()
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Undo everything created, in reverse order; signals arriving meanwhile wait until the end."""
        self._closing = True
        problems = []
        if self._undo:
            self._undo.append(("stop our processes", self.stop_processes))  # gracefully, before anything else
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as error:  # one failed step must not stop the rest of the cleanup
                problems.append(f"{what}: {error}")
        for problem in problems:
            print(f"netem cleanup: could not {problem}", file=sys.stderr)
        self._restore_signal_handlers()
        self._closing = False
        if self._deferred_signal is not None:
            signum, self._deferred_signal = self._deferred_signal, None
            signal.raise_signal(signum)

    def _push(self, what: str, undo: Callable[[], object]) -> None:
        self._undo.append((what, undo))

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise HarnessError("the emulated cluster needs root (network namespaces, tc, iptables)")
        for tool in ("ip", "tc", "iptables", "unshare", "hostname", "mount"):
            if not shutil.which(tool):
                raise HarnessError(f"{tool} is not installed (apt-get install iproute2 iptables util-linux)")
        leftovers = self.names.existing()
        if any(leftovers.values()):
            found = ", ".join(item for group in leftovers.values() for item in group)
            raise HarnessError(
                f"{found} already exist: another harness with prefix {self.names.prefix!r} is running, or one "
                f"was killed; remove its leftovers with `python benchmarks/netem.py --cleanup --prefix {self.names.prefix}`"
            )
        for route in json.loads(_run(["ip", "-j", "-4", "route", "show"]).stdout or "[]"):
            if route["dst"] != "default" and ipaddress.IPv4Network(route["dst"], strict=False).overlaps(self.subnet):
                raise HarnessError(f"subnet {self.subnet} overlaps the host's route {route['dst']}: choose another")

    def _build(self) -> None:
        if not NETNS_DIR.exists():
            # `ip netns add` makes /run/netns a shared mount point; pushed first, undone last.
            self._push("remove /run/netns", _remove_netns_dir_if_unused)
        self._directory = Path(tempfile.mkdtemp(prefix=f"{self.names.prefix}-netem-"))
        self._push(f"remove {self._directory}", lambda: shutil.rmtree(cast(Path, self._directory), ignore_errors=True))
        self._write_hosts_file()
        for bridge in self.bridges:
            self._add_bridge(bridge)
        # One address for the host on the subnet: on two bridges it would be two routes to it.
        _run(["ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridges[0]])
        if self.racks > 1:
            self._add_uplink()
        for index in range(self.workers):
            self._add_worker(index)

    def _add_bridge(self, bridge: str) -> None:
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        self._push(f"delete bridge {bridge}", lambda: _delete_link_if_present(bridge))
        _run(["ip", "link", "set", bridge, "up"])
        rule = self.names.forward_rule(bridge)
        _run(["iptables", "-I", "FORWARD", "1", *rule])
        self._push(f"delete our iptables rule for {bridge}", lambda: _run(["iptables", "-D", "FORWARD", *rule]))

    def _add_uplink(self) -> None:
        """The veth pair between the two racks' bridges, shaped on both ends."""
        ends = [self.names.uplink(0), self.names.uplink(1)]
        _run(["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]])
        self._push(f"delete veth {ends[0]}", lambda: _delete_link_if_present(ends[0]))
        tbf = tbf_parameters(cast(float, self.uplink_rate_mbit))  # set whenever racks > 1 (checked in __init__)
        for end, bridge in zip(ends, self.bridges):
            _run(["ip", "link", "set", end, "master", bridge, "up"])
            _run(["tc", "qdisc", "add", "dev", end, "root", "tbf", *tbf])

    def _add_worker(self, index: int) -> None:
        namespace, host_veth, inside = self.names.namespace(index), self.names.host_veth(index), self.interface
        _run(["ip", "netns", "add", namespace])
        self._push(f"delete namespace {namespace}", lambda: _delete_namespace(namespace))
        # The namespace end is created directly inside the namespace, so its name, the same in
        # every namespace, never meets the host's interfaces.
        _run(["ip", "link", "add", host_veth, "type", "veth", "peer", "name", inside, "netns", namespace])
        self._push(f"delete veth {host_veth}", lambda: _delete_link_if_present(host_veth))
        _run(["ip", "link", "set", host_veth, "master", self.bridges[self.rack(index)], "up"])
        _run(["ip", "-n", namespace, "addr", "add", f"{self.address(index)}/24", "dev", inside])
        _run(["ip", "-n", namespace, "link", "set", inside, "up"])
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        self._shape(index, self.rate_mbit, "add")

    def _shape(self, index: int, rate_mbit: float, verb: str) -> None:
        tbf = tbf_parameters(rate_mbit)
        _run(["tc", "qdisc", verb, "dev", self.names.host_veth(index), "root", "tbf", *tbf])
        _run(["tc", "-n", self.names.namespace(index), "qdisc", verb, "dev", self.interface, "root", "tbf", *tbf])

    def _write_hosts_file(self) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{self.address(i)} {name}" for i, name in enumerate(self.hostnames)]
        (cast(Path, self._directory) / "hosts").write_text("\n".join(lines) + "\n")

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.workers:
            raise HarnessError(f"worker index {index} is outside 0..{self.workers - 1}")

    # -- signals -----------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        # Python delivers signals to the main thread only; elsewhere the caller must handle them.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._closing:
            self._deferred_signal = signum  # delivered again once the cleanup is complete
            return
        # Unwinding through `with` runs close(); the exception then ends the program as the
        # signal would have (SIGINT as KeyboardInterrupt, others as exit status 128 + N).
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


def _remove_netns_dir_if_unused() -> None:
    if NETNS_DIR.exists() and not any(NETNS_DIR.iterdir()):
        _run(["umount", str(NETNS_DIR)], check=False)
        NETNS_DIR.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanup", action="store_true", help="remove leftovers of a killed harness")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    args = parser.parse_args(argv)
    if not args.cleanup:
        parser.print_help()
        return 0
    removed = remove_leftovers(args.prefix)
    print(f"removed {', '.join(removed)}" if removed else f"nothing with prefix {args.prefix!r} to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main())
