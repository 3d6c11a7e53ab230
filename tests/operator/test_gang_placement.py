"""A job's gang placement from Node and Pod objects, without a cluster: which nodes the worker pod
may use, R-Storm over them, who places under each policy, and the placed topology."""

from __future__ import annotations

from collections import Counter

import pytest

from caramel.contract.api import PlacedBy, WorkerNode
from caramel.contract.jobfile import parse_job
from caramel.network.labels import ClusterLinks
from caramel_operator.builders import build_worker_pod
from caramel_operator.gang_placement import NoRoom, Placed, admits, place, placed_by, placed_topology, placement_problems

RACK = "topology.caramel.dev/rack"
TAS = {"metadata": {"annotations": {"kueue.x-k8s.io/podset-preferred-topology": "cloud.example.com/rack"}}}


def job(name="demo", **spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name, "namespace": "ml"},
         "spec": {"script": "t.py", **spec}}
    )


def node(name, rack="r1", zone="z", cpu="8", memory="32Gi", **extra):
    labels = {"topology.kubernetes.io/zone": zone, RACK: rack, **extra.pop("labels", {})}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": extra.pop("spec", {}),
        "status": {"allocatable": {"cpu": cpu, "memory": memory}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(name, on, cpu="1", memory="1Gi", namespace="other", labels=None, phase="Running"):
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        "status": {"phase": phase},
    }


def placing(the_job, nodes, pods=(), min_workers=None):
    """The placement of the whole gang, or of as many workers from `min_workers` up as fit."""
    replicas = the_job.spec.workers.replicas
    return place(the_job, build_worker_pod(the_job, 0, default_image="x"), nodes, list(pods), RACK, min_workers or replicas, replicas)


REQUESTS = {"replicas": 4, "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}


def test_the_gang_is_packed_into_one_rack_and_ranks_follow_nodes():
    nodes = [node("a1", "ra", cpu="4", memory="16Gi"), node("b1", "rb"), node("b2", "rb", cpu="4", memory="16Gi"), node("c1", "rc")]
    placed = placing(job(workers={**REQUESTS, "replicas": 6}), nodes)
    assert isinstance(placed, Placed) and placed.cpu_short == ()
    # Rack rb has the most free; its biggest node first, then the rest of the rack, not rack rc.
    assert [w.node for w in placed.workers] == ["b1"] * 4 + ["b2"] * 2
    assert placed.workers[0] == WorkerNode(node="b1", rack="z/rb", zone="z")


def test_what_other_pods_request_is_taken_but_not_the_gangs_own_old_pods():
    nodes = [node("a1", "ra"), node("b1", "rb")]
    busy = [pod("db", "a1", cpu="7", memory="30Gi")]
    own_old = [pod(f"demo-worker-{i}", "b1", cpu="2", memory="8Gi", namespace="ml", labels={"caramel.dev/job": "demo"}) for i in range(4)]
    finished = [pod("done", "b1", cpu="8", memory="32Gi", phase="Succeeded")]
    placed = placing(job(workers=REQUESTS), nodes, busy + own_old + finished)
    assert {w.node for w in placed.workers} == {"b1"}
    # Another job's pods with the same name label in another namespace do count.
    other_namespace = [pod(p["metadata"]["name"], "b1", cpu="2", memory="8Gi", labels={"caramel.dev/job": "demo"}) for p in own_old]
    assert isinstance(placing(job(workers=REQUESTS), nodes, busy + other_namespace), NoRoom)


def test_the_templates_node_selection_and_tolerations_bind_the_placement():
    gpu = {"labels": {"pool": "gpu"}}
    tainted = {"labels": {"pool": "gpu"}, "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}
    nodes = [node("cpu1", cpu="64", memory="256Gi"), node("gpu1", **gpu), node("gpu2", **tainted)]
    selecting = {**REQUESTS, "replicas": 2, "template": {"spec": {"nodeSelector": {"pool": "gpu"}}}}
    assert {w.node for w in placing(job(workers=selecting), nodes).workers} == {"gpu1"}
    tolerating = {"spec": {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    placed = placing(job(workers={**REQUESTS, "replicas": 8, "template": tolerating}), nodes)
    assert Counter(w.node for w in placed.workers) == {"gpu1": 4, "gpu2": 4}


def test_sidecars_count_in_the_workers_requests():
    sidecar = {"spec": {"containers": [{"name": "proxy", "image": "p", "resources": {"requests": {"memory": "8Gi"}}}]}}
    nodes = [node("a1", memory="32Gi")]
    assert isinstance(placing(job(workers={**REQUESTS, "replicas": 2, "template": sidecar}), nodes), Placed)
    assert isinstance(placing(job(workers={**REQUESTS, "replicas": 3, "template": sidecar}), nodes), NoRoom)


@pytest.mark.parametrize(
    ("nodes", "workers", "says"),
    [
        ([node("a1")], {"replicas": 5, "resources": {"requests": {"memory": "8Gi"}}}, "short of memory: free memory holds 4 of them"),
        ([node("a1", labels={"pool": "cpu"})], {"template": {"spec": {"nodeSelector": {"pool": "gpu"}}}},
         "none of the 1 nodes matches the nodeSelector and node affinity of spec.workers.template"),
        ([node("a1", spec={"unschedulable": True})], {}, "none of the 1 nodes the workers may use is schedulable"),
        ([], {}, "no schedulable node"),
    ],
    ids=["memory", "selector", "cordoned", "no-nodes"],
)
def test_no_room_says_why(nodes, workers, says):
    outcome = placing(job(workers=workers), nodes)
    assert isinstance(outcome, NoRoom) and says in outcome.message, outcome


def test_cpu_is_soft_and_named_when_short():
    placed = placing(job(workers={"replicas": 2, "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}}), [node("a1")])
    assert [w.node for w in placed.workers] == ["a1", "a1"] and placed.cpu_short == ("a1",)


def test_a_gang_that_may_shrink_gets_as_many_workers_as_fit_with_their_cpu():
    """spec.workers.minReplicas: from `min_workers` up, the most workers whose memory and CPU both fit,
    so that none waits for CPU; `min_workers` itself CPU-short where that is all there is (CPU is soft)."""
    elastic = job(workers={"replicas": 6, "minReplicas": 2, "resources": {"requests": {"cpu": "3", "memory": "8Gi"}}})
    # Memory holds 4 on each node, CPU 2 (8 cores): 4 fit with their CPU.
    placed = placing(elastic, [node("a1"), node("a2")], min_workers=2)
    assert len(placed.workers) == 4 and placed.cpu_short == ()
    assert isinstance(placing(elastic, [node("a1"), node("a2")]), Placed)  # the whole gang, CPU-short, as before
    # Only one gets its CPU: two are placed, one short of CPU; fewer than two: no room.
    short = placing(elastic, [node("a1", cpu="4")], min_workers=2)
    assert len(short.workers) == 2 and short.cpu_short == ("a1",)
    none = placing(elastic, [node("a1", memory="8Gi")], min_workers=2)
    assert isinstance(none, NoRoom) and none.message.startswith("cannot place 2 workers"), none
    # The gang's own pods free their room: it may grow into it.
    own = [pod(f"demo-worker-{i}", "a1", cpu="3", memory="8Gi", namespace="ml", labels={"caramel.dev/job": "demo"}) for i in range(2)]
    assert len(placing(elastic, [node("a1"), node("a2")], own, min_workers=3).workers) == 4


@pytest.mark.parametrize(
    ("requirement", "labels", "holds"),
    [
        ({"key": "pool", "operator": "In", "values": ["gpu", "tpu"]}, {"pool": "gpu"}, True),
        ({"key": "pool", "operator": "In", "values": ["gpu"]}, {}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["gpu"]}, {"pool": "cpu"}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["gpu"]}, {}, True),
        ({"key": "pool", "operator": "Exists"}, {"pool": ""}, True),
        ({"key": "pool", "operator": "DoesNotExist"}, {"pool": "cpu"}, False),
        ({"key": "cores", "operator": "Gt", "values": ["8"]}, {"cores": "16"}, True),
        ({"key": "cores", "operator": "Lt", "values": ["8"]}, {"cores": "16"}, False),
        ({"key": "cores", "operator": "Gt", "values": ["8"]}, {"cores": "many"}, False),
    ],
)
def test_node_affinity_operators(requirement, labels, holds):
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}}}
    assert admits(spec, {"metadata": {"name": "n", "labels": labels}}) is holds


def test_node_affinity_terms_are_ored_and_expressions_anded():
    def terms(*items):
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(items)}}}}

    gpu_a = {"metadata": {"name": "a", "labels": {"pool": "gpu"}}}
    both = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
    assert not admits(terms(both), gpu_a)
    assert admits(terms(both, by_name), gpu_a)
    assert not admits(terms({}), gpu_a)  # an empty term matches no node
    assert not admits({"nodeSelector": {"pool": "cpu"}}, gpu_a)


def who_places(the_job):
    return placed_by(the_job, build_worker_pod(the_job, 0, default_image="x"))


def test_who_places_under_each_policy():
    assert who_places(job()) == (PlacedBy.RSTORM, "")
    assert who_places(job(placement={"policy": "Scheduler"})) == (PlacedBy.SCHEDULER, "")
    assert who_places(job(runPolicy={"schedulingPolicy": {"queue": "research"}})) == (PlacedBy.KUEUE, "")
    assert who_places(job(workers={"template": TAS})) == (PlacedBy.KUEUE, "")
    # Asked for explicitly, R-Storm places a gang Kueue admits by quota.
    assert who_places(job(placement={"policy": "RStorm"}, runPolicy={"schedulingPolicy": {"queue": "research"}}))[0] is PlacedBy.RSTORM


def test_auto_leaves_gangs_asking_for_resources_rstorm_does_not_weigh_to_the_scheduler():
    fpgas = {"resources": {"limits": {"example.com/fpga": 1, "nvidia.com/gpu": 1, "memory": "8Gi"}}}
    by, why = who_places(job(workers=fpgas))
    assert by is PlacedBy.SCHEDULER and why.startswith("R-Storm weighs CPU, memory and GPUs only and the workers ask for example.com/fpga")
    sidecar = {"template": {"spec": {"containers": [{"name": "cache", "resources": {"requests": {"hugepages-2Mi": "1Gi"}}}]}}}
    assert who_places(job(workers=sidecar))[0] is PlacedBy.SCHEDULER
    assert who_places(job(workers={"resources": {"requests": {"ephemeral-storage": "10Gi"}}}))[0] is PlacedBy.RSTORM
    assert who_places(job(workers=fpgas, placement={"policy": "RStorm"})) == (PlacedBy.RSTORM, "")
    # GPUs R-Storm weighs, as a hard constraint: a GPU gang is its to place.
    assert who_places(job(workers={"resources": {"limits": {"nvidia.com/gpu": 2}}})) == (PlacedBy.RSTORM, "")


def test_rstorm_with_kueue_topology_aware_scheduling_is_refused_naming_both():
    [problem] = placement_problems(job(placement={"policy": "RStorm"}, workers={"template": TAS}))
    assert problem.startswith("spec.placement.policy: RStorm pins every worker to a node")
    assert "kueue.x-k8s.io/podset-preferred-topology" in problem and "use Auto" in problem
    assert placement_problems(job(workers={"template": TAS})) == []


def test_the_placed_topology_has_a_host_per_rank_grouped_by_rack():
    workers = [WorkerNode(node="a1", rack="z/ra", zone="z"), WorkerNode(node="b1", rack="z/rb", zone="z")]
    links = ClusterLinks.model_validate({"rack": {"gbps": 10}})
    topology = placed_topology(workers, slots_per_worker=2, links=links)
    assert topology.hosts == ("w0", "w1", "w2", "w3") and topology.groups == ("z/ra", "z/ra", "z/rb", "z/rb")
    uplinks = [link for link in topology.links if link.a.startswith("rack:")]
    assert {link.bandwidth for link in uplinks} == {links.rack.bandwidth}
