"""The emulated racks (benchmarks/netem.py) and the topology benchmark's own logic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import benchmarks.topology_bench as topology_bench
from benchmarks.netem import EmulatedCluster, HarnessError, Names, rack_of
from caramel.allreduce.simulate import choose_allreduce
from conftest import unavailable

PREFIX, SUBNET = "crtt", "10.213.10.0/24"  # neither the benchmarks' nor the scheduling bench's
SERVE_ONCE = """
import socket
with socket.create_server(("", 5555)) as server:
    connection, _ = server.accept()
    connection.sendall(b"hello from rack 1")
    connection.close()
"""
GREET = """
import socket, sys, time
for _ in range(100):  # the server may still be starting
    try:
        print(socket.create_connection((sys.argv[1], 5555), timeout=5).recv(100).decode())
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
"""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"racks": 3, "uplink_rate_mbit": 10}, "racks: 3 is not one of 1, 2"),
        ({"racks": 2}, "uplink_rate_mbit: give it exactly when there are several racks"),
        ({"uplink_rate_mbit": 10}, "uplink_rate_mbit: give it exactly when there are several racks"),
        ({"racks": 2, "uplink_rate_mbit": 0}, "uplink_rate_mbit must be positive"),
    ],
)
def test_bad_racks_are_named(kwargs, message):
    with pytest.raises(HarnessError, match=message):
        EmulatedCluster(4, 100, prefix=PREFIX, subnet=SUBNET, **kwargs)
    with pytest.raises(HarnessError, match="2 racks need at least as many workers, got 1"):
        EmulatedCluster(1, 100, prefix=PREFIX, subnet=SUBNET, racks=2, uplink_rate_mbit=10)


def test_racks_hold_consecutive_workers_the_first_the_larger():
    assert [rack_of(index, 5, 2) for index in range(5)] == [0, 0, 0, 1, 1]
    cluster = EmulatedCluster(4, 100, prefix=PREFIX, subnet=SUBNET, racks=2, uplink_rate_mbit=25)
    assert [cluster.rack(index) for index in range(4)] == [0, 0, 1, 1]
    assert cluster.bridges == ["crtt-br0", "crtt-br1"]
    assert EmulatedCluster(4, 100, prefix=PREFIX, subnet=SUBNET).bridges == ["crtt-br"]  # as before


def test_testbed_topologies_and_what_auto_picks_on_them():
    racks = topology_bench.testbed_topology("racks", 8, 1000, 250)
    assert racks.groups == ("rack0",) * 4 + ("rack1",) * 4
    assert racks.bandwidth.min() == 250e6 / 8
    assert choose_allreduce(racks, 64 * 2**20) == "multitree"
    assert choose_allreduce(topology_bench.testbed_topology("flat", 8, 1000, 250), 64 * 2**20) == "ring"
    assert topology_bench.bound_seconds("racks", 8, 250e6 / 8, 1000, 250) == 1.0  # the buffer over the uplink
    assert topology_bench.bound_seconds("flat", 8, 1000e6 / 8, 1000, 250) == 1.75  # 2 (N - 1) / N over a host link


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--testbeds", "racks,torus"], "--testbeds: unknown testbed 'torus'"),
        (["--sizes", "64,big"], "--sizes: whole numbers of MiB"),
        (["--sizes", "0"], "--sizes: every size must be at least 1 MiB"),
        (["--workers", "1"], "--workers: at least 2"),
        (["--piece-kib", "0"], "--piece-kib must be positive"),
    ],
)
def test_bad_benchmark_arguments_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        topology_bench.main(argv)
    assert message in capsys.readouterr().err


def test_table_gives_medians_spreads_ratios_and_bounds():
    events = [
        {"event": "allreduce", "testbed": "racks", "megabytes": 64, "algorithm": algorithm, "seconds": seconds,
         "bound_seconds": 2.0, "auto": "multitree"}
        for algorithm, times in (("ring", (4.0, 4.4, 3.9)), ("multitree", (2.2, 2.4, 2.3)))
        for seconds in times
    ] + [{"event": "check", "testbed": "racks", "megabytes": 64, "max_difference": 1e-7}]
    row = topology_bench.table(events).splitlines()[-1]
    assert row == (
        "| racks | 64 | 4.000 (3.900-4.400) | 2.300 (2.200-2.400) | 1.74 | 2.000 | 1.15 | 2.00 | multitree | 1.0e-07 |"
    )


def test_model_table_gives_each_algorithms_step_and_what_auto_chose():
    steps = {"horovod": (1.5, 1.7), "caramel ring": (1.4, 1.4), "caramel multitree": (1.0, 1.1), "caramel auto": (1.0, 1.2)}
    events = [
        {"event": "model", "testbed": "racks", "algorithm": label, "seconds": seconds,
         "allreduce": {"caramel ring": "ring", "horovod": None}.get(label, "multitree")}
        for label, times in steps.items() for seconds in times
    ]  # fmt: skip
    row = topology_bench.model_table(events, "resnet50").splitlines()[-1]
    assert row == (
        "| racks | horovod 1.600 (1.500-1.700) | 1.400 (1.400-1.400) | 1.050 (1.000-1.100) | 1.100 (1.000-1.200) "
        "| 1.52 | 1.27 | multitree |"
    )


@pytest.mark.e2e
def test_two_racks_are_built_shaped_and_removed():
    if os.geteuid() != 0:
        unavailable("building network namespaces needs root (.ci/run runs as root)")
    names = Names(PREFIX)
    with EmulatedCluster(4, 1000, prefix=PREFIX, subnet=SUBNET, racks=2, uplink_rate_mbit=250) as cluster:
        links = {link["ifname"]: link for link in json.loads(subprocess.check_output(["ip", "-j", "link", "show"]))}
        assert links["crtt-u0"]["master"] == "crtt-br0" and links["crtt-u1"]["master"] == "crtt-br1"
        assert [links[f"crtt-h{index}"]["master"] for index in range(4)] == ["crtt-br0"] * 2 + ["crtt-br1"] * 2
        for end in ("crtt-u0", "crtt-u1"):  # the uplink shaped both ways
            qdisc = json.loads(subprocess.check_output(["tc", "-j", "qdisc", "show", "dev", end]))[0]
            assert qdisc["kind"] == "tbf" and qdisc["options"]["rate"] == 250e6 / 8
        server = cluster.spawn(3, [sys.executable, "-c", SERVE_ONCE], {})
        client = cluster.spawn(0, [sys.executable, "-c", GREET, cluster.address(3)], {})  # across the uplink
        assert client.communicate(timeout=30)[0] == b"hello from rack 1\n"
        server.wait(timeout=30)
        assert all(names.existing().values())
    assert not any(names.existing().values())
