"""The topology model: validation, routes, topology files, compact JSON, and node labels."""

from __future__ import annotations

import re

import pytest

from caramel.network.labels import ClusterLinks, Position, gang_topology, position
from caramel.network.model import Link, Topology
from caramel.network.spec import TopologySpecError, load_topology, parse_topology
from caramel.network.synthetic import GIGABIT, STANDARD, fat_tree, racks, torus
from caramel.network.wire import from_json, to_json


def hosts_on_route(topology: Topology, src: int, dst: int) -> list[str]:
    names = (*topology.hosts, *topology.switches)
    nodes = [topology.links[link // 2].a if link % 2 == 0 else topology.links[link // 2].b for link in topology.route(src, dst)]
    return [names[topology.index[node]] for node in nodes]


def test_torus_and_mesh_have_the_right_links_and_a_ring_order_of_neighbours():
    grid = torus(4, 4, GIGABIT)
    assert grid.size == 16 and len(grid.links) == 32 and grid.direct
    # Snake order: consecutive ranks, and the last and the first, are neighbours.
    for rank in range(16):
        assert len(grid.route(rank, (rank + 1) % 16)) == 1
    assert [grid.graph.degree(host) for host in range(16)] == [4] * 16
    assert len(STANDARD["mesh-4x4"]().links) == 24


def test_fat_tree_sizes_and_equal_cost_routes_spread():
    tree = fat_tree(4, GIGABIT)
    assert (tree.size, len(tree.switches), len(tree.links)) == (16, 20, 48)
    assert len(tree.route(0, 1)) == 2  # same edge switch
    assert len(tree.route(0, 15)) == 6  # another pod: up to a core and down
    cores_used = {hosts_on_route(tree, src, 15)[3] for src in range(4)}
    assert len(cores_used) > 1  # different pairs take different equal paths


def test_switched_routes_never_pass_through_a_host():
    topology = Topology(
        hosts=("a", "b", "c"),
        switches=("s",),
        links=(Link("a", "b", 1.0), Link("b", "s", 1.0), Link("c", "s", 1.0), Link("a", "s", 1.0)),
    )
    assert hosts_on_route(topology, 0, 2) == ["a", "s"]  # not a -> b -> s
    assert len(topology.route(0, 1)) == 1  # the direct link
    assert topology.hop_route(0, 2) == topology.route(0, 2)
    direct = torus(3, 3, 1.0)
    assert direct.hop_route(0, 4) is None and len(direct.route(0, 4)) == 2


def test_groups_default_to_the_first_switch():
    topology = racks(2, 2, 1.0, 1.0)
    assert topology.groups == ("tor0", "tor0", "tor1", "tor1")
    bare = Topology(hosts=("a", "b", "s"), switches=(), links=(Link("a", "b", 1.0), Link("b", "s", 1.0)))
    assert bare.groups == ("", "", "")


@pytest.mark.parametrize(
    "links, message",
    [
        ((Link("a", "x", 1.0),), "links[0] (a - x): unknown node 'x'"),
        ((Link("a", "a", 1.0),), "links[0] (a - a): a link joins two different nodes"),
        ((Link("a", "b", 0.0),), "links[0] (a - b): bandwidth must be a positive"),
        ((Link("a", "b", 1.0, -1.0),), "links[0] (a - b): latency must be zero or more"),
        ((Link("a", "b", 1.0), Link("b", "a", 1.0)), "links[1] (b - a): two links join the same nodes"),
        ((), "the network is not connected"),
    ],
)
def test_bad_topologies_name_the_link(links, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Topology(hosts=("a", "b"), switches=(), links=links)


def test_repeated_names_and_wrong_group_counts_are_errors():
    with pytest.raises(ValueError, match="repeated: a"):
        Topology(hosts=("a",), switches=("a",), links=())
    with pytest.raises(ValueError, match="groups: expected one group per host"):
        Topology(hosts=("a", "b"), switches=(), links=(Link("a", "b", 1.0),), groups=("g",))


@pytest.mark.parametrize(
    "document",
    [
        {"kind": "torus", "rows": 4, "cols": 4, "link": {"gbps": 100, "latencyUs": 1}},
        {"kind": "mesh", "rows": 2, "cols": 3, "link": {"gbps": 10}},
        {"kind": "fatTree", "k": 4, "link": {"gbps": 100}},
        {"kind": "racks", "racks": 2, "hostsPerRack": 8, "link": {"gbps": 100}, "uplink": {"gbps": 25}},
    ],
)
def test_synthetic_kinds_from_documents(document):
    topology = parse_topology(document)
    assert topology.bandwidth.max() == document["link"]["gbps"] * GIGABIT


def test_a_graph_document_with_groups_and_latencies():
    topology = parse_topology(
        {
            "kind": "graph",
            "hosts": [{"name": "a", "group": "left"}, {"name": "b", "group": "right"}],
            "switches": ["s"],
            "links": [
                {"between": ["a", "s"], "gbps": 8, "latencyUs": 5},
                {"between": ["b", "s"], "gbps": 8, "latencyUs": 5},
            ],
        }
    )
    assert topology.groups == ("left", "right")
    assert topology.bandwidth[0] == 1e9
    assert topology.route_latency(topology.route(0, 1)) == pytest.approx(10e-6)


@pytest.mark.parametrize(
    "document, named",
    [
        ({"kind": "torus", "rows": 1, "cols": 4, "link": {"gbps": 1}}, "rows"),
        ({"kind": "racks", "racks": 2, "hostsPerRack": 8, "link": {"gbps": -1}, "uplink": {"gbps": 1}}, "link.gbps"),
        ({"kind": "fatTree", "k": 3, "link": {"gbps": 1}}, "  k: Input should be a multiple of 2"),
        ({"kind": "torus", "rows": 4, "cols": 4, "link": {"gbps": 1}, "colour": 1}, "colour: unknown field"),
        ({"kind": "ring", "hosts": 4}, "kind: must be one of torus, mesh, fatTree, racks, graph (got 'ring')"),
        (
            {"kind": "graph", "hosts": [{"name": "a"}], "links": [{"between": ["a", "x"], "gbps": 1}]},
            "(document): links[0] (a - x): unknown node 'x'",
        ),
        (
            {"kind": "graph", "hosts": [{"name": "a", "group": "g"}, {"name": "b"}], "links": [{"between": ["a", "b"], "gbps": 1}]},
            "hosts[1].group: give every host a group, or none",
        ),
    ],
)
def test_bad_documents_name_the_field(document, named):
    with pytest.raises(TopologySpecError) as error:
        parse_topology(document, source="t.yaml")
    assert named in str(error.value) and str(error.value).startswith("t.yaml is not a valid topology:\n")


def test_topology_files(tmp_path):
    good = tmp_path / "racks.yaml"
    good.write_text("kind: racks\nracks: 2\nhostsPerRack: 2\nlink: {gbps: 10}\nuplink: {gbps: 1}\n")
    assert load_topology(good).size == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    with pytest.raises(TopologySpecError, match="is not valid YAML"):
        load_topology(bad)
    with pytest.raises(TopologySpecError, match="cannot read topology file"):
        load_topology(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", sorted(STANDARD))
def test_compact_json_round_trips(name):
    topology = STANDARD[name]()
    text = to_json(topology)
    assert from_json(text) == topology
    assert len(text) < 40 * len(topology.links) + 20 * topology.size


@pytest.mark.parametrize(
    "text, named",
    [
        ('{"v": 2}', "v: Input should be 1"),
        (
            '{"v":1,"hosts":["a","b"],"switches":[],"groups":[0,0],"groupNames":["g"],"speeds":[[1,0]],"links":[[0,1,3]]}',
            "links[0]: speed must be within 0..0",
        ),
        (
            '{"v":1,"hosts":["a","b"],"switches":[],"groups":[0,4],"groupNames":["g"],"speeds":[[1,0]],"links":[[0,1,0]]}',
            "groups: every group must be within 0..0",
        ),
    ],
)
def test_bad_compact_json_names_the_field(text, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        from_json(text)


def test_positions_from_labels():
    labels = {"topology.kubernetes.io/zone": "z1", "example.com/rack": "r7", "kubernetes.io/hostname": "host-3"}
    assert position("node-3", labels, rack_label="example.com/rack") == Position("z1", "z1/r7", "node-3")
    # Without a rack label a node is alone in its rack; without a zone it is in the zone "".
    assert position("node-4", {}, rack_label="example.com/rack") == Position("", "/node:node-4", "node-4")


def test_gang_topology_shares_a_node_link_between_its_workers_and_groups_by_rack():
    links = ClusterLinks.model_validate({"node": {"gbps": 8}, "rack": {"gbps": 4}, "zone": {"gbps": 2}})
    where = [Position("z1", "z1/r1", "n1"), Position("z1", "z1/r1", "n1"), Position("z1", "z1/r2", "n2"), Position("z2", "z2/r3", "n3")]
    topology = gang_topology(where, links)
    assert topology.hosts == ("w0", "w1", "w2", "w3")
    assert topology.groups == ("z1/r1", "z1/r1", "z1/r2", "z2/r3")
    bottleneck = [float(topology.bandwidth[list(topology.route(0, dst))].min()) for dst in (1, 2, 3)]
    assert bottleneck == [links.local.bandwidth, 4 * GIGABIT, 2 * GIGABIT]
    # Both workers of n1 leave through the same node link.
    assert set(topology.route(0, 2)) & set(topology.route(1, 2))
    assert "core" in topology.switches and "core" not in gang_topology(where[:3], links).switches
