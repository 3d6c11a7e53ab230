"""Gangs that shrink instead of waiting, and grow back (spec.workers.minReplicas): the operator, a
real process, against the Kubernetes API emulator, which holds the cluster's Node objects.

What this shows: the decisions (when a gang runs smaller, when it grows, what the status and
Events say) and the pods sent (how many, their world size). What it cannot: the emulator has no
scheduler and no kubelet, so the tests play them, binding or refusing pods and reporting a lost
node; rank 0's metrics endpoint is a real one, fed as the runtime feeds it. The cluster suite
(tests/cluster) runs a shrinking gang on a real cluster, and tests/launch/test_local_run.py one resumed
from its checkpoint with real workers.
"""

from __future__ import annotations

import pytest

from caramel.metrics import WorkerMetrics
from testbed.operator_harness import NODES, Emulator, Operator, eventually, node, printer_row, terminated
from testbed.ports import free_port

# Short enough for tests: a gang short of room is placed smaller after it, and a gang running
# short looks for room that often.
GANG_TIMEOUT_SECONDS = 3
# Each worker takes most of a node: one fits per node.
ONE_PER_NODE = {"cpu": "10", "memory": "40Gi"}
SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"]}


def workers(replicas=3, minimum=2):
    return {"replicas": replicas, "minReplicas": minimum, "resources": {"requests": ONE_PER_NODE}}


def nodes(count):
    return [node(f"node-{i}", "rack-1") for i in range(count)]


def env(pod):
    return {var["name"]: var["value"] for var in pod["spec"]["containers"][0]["env"]}


def pinned_node(pod):
    [term] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return term["matchFields"][0]["values"][0]


def gang(api, job, number, size):
    """The job's pods once they are all of gang `number`, `size` of them."""
    pods = api.pods(job)
    return len(pods) == size and all(p["metadata"]["labels"]["caramel.dev/gang"] == str(number) for p in pods) and pods


def event_messages(api, reason):
    return [(event["type"], event["message"]) for event in api.events(reason)]


def posted(api, reason, count):
    """The messages of the Events of a reason, once `count` are posted: a pass posts its Events
    after it has created its pods."""
    return eventually(lambda: len(event_messages(api, reason)) >= count and event_messages(api, reason), what=f"{count} {reason} Events")


def resized_condition(api, job):
    return next((c for c in api.status(job).get("conditions", []) if c["type"] == "Resized"), None)


@pytest.fixture
def cluster(tmp_path, request):
    """The emulator with `request.param` nodes, and the operator with a short gang timeout."""
    emulator = Emulator(tmp_path, nodes=nodes(request.param))
    operator = Operator(emulator, tmp_path, CARAMEL_GANG_SCHEDULING_TIMEOUT_SECONDS=str(GANG_TIMEOUT_SECONDS))
    yield emulator.api
    operator.stop()
    emulator.stop()


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_a_gang_without_room_runs_smaller_and_grows_after_a_checkpoint_once_room_appears(cluster):
    api = cluster
    port = free_port()
    rank0 = WorkerMetrics(rank=0)
    rank0.serve(port)
    rank0.record_step(12, 0.1, 1.2)
    rank0.checkpoint_step.set(10)
    spec = {**SPEC, "workers": workers(), "checkpoint": {"path": "/ckpt", "intervalSteps": 10}, "metrics": {"port": port}}
    api.create_job("demo", spec)

    # Two nodes hold two of the three workers: R-Storm says so, and places two once the gang
    # has waited the gang scheduling timeout.
    message = eventually(lambda: api.status("demo").get("message"), what="why it waits")
    assert message.startswith("cannot place the gang: cannot place 3 workers"), message
    pods = eventually(lambda: gang(api, "demo", 0, 2), timeout=30, what="a gang of two")
    assert {(env(pod)["HOROVOD_SIZE"], env(pod)["CARAMEL_FULL_SIZE"]) for pod in pods} == {("2", "3")}
    assert sorted(pinned_node(pod) for pod in pods) == ["node-0", "node-1"]
    shrunk = f"running 2 of 3 workers: the whole gang did not fit within the gang scheduling timeout ({GANG_TIMEOUT_SECONDS} s)"
    assert posted(api, "Resized", 1) == [("Warning", shrunk)]
    assert resized_condition(api, "demo")["message"] == shrunk and resized_condition(api, "demo")["status"] == "True"
    api.run_pods("demo", podIP="127.0.0.1")
    eventually(lambda: api.status("demo").get("phase") == "Running", what="the smaller gang running")
    row = printer_row(api.job("demo"))
    assert (row["Ready"], row["Size"]) == ("2/3", 2)

    # Room for the third: found at the next look, used after the next checkpoint.
    api.create(NODES, node("node-2", "rack-1"))
    eventually(lambda: api.events("RoomToGrow"), timeout=30, what="room found")
    assert event_messages(api, "RoomToGrow") == [
        ("Normal", "room for 3 of 3 workers: the gang of 2 restarts with them after its next checkpoint")
    ]
    assert api.status("demo")["size"]["growAfterStep"] == 10
    assert api.status("demo")["phase"] == "Running" and gang(api, "demo", 0, 2)  # no checkpoint yet, no restart
    rank0.checkpoint_step.set(20)
    pods = eventually(lambda: gang(api, "demo", 1, 3), timeout=30, what="the gang grown to three")
    assert {(env(pod)["HOROVOD_SIZE"], env(pod)["CARAMEL_FULL_SIZE"]) for pod in pods} == {("3", "3")}
    status = api.status("demo")
    assert status["restarts"] == 0 and status["size"] == {**status["size"], "workers": 3, "reason": ""}
    [(kind, grew)] = event_messages(api, "GangResized")
    assert kind == "Normal" and grew.startswith("room for 3 of 3 workers, and a checkpoint at step 20: the gang of 2 grows")
    assert posted(api, "Resized", 2)[-1] == ("Normal", "running all 3 workers again")
    assert resized_condition(api, "demo")["status"] == "False"


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_a_lost_node_restarts_the_gang_with_the_workers_that_fit(cluster):
    api = cluster
    api.create_job("demo", {**SPEC, "workers": workers()})
    pods = eventually(lambda: gang(api, "demo", 0, 3), what="the whole gang")
    api.run_pods("demo")
    eventually(lambda: api.status("demo").get("phase") == "Running", what="Running")
    # The node under one worker goes: the kubelet's last word on the pod, and the Node object.
    lost = next(pod for pod in pods if pinned_node(pod) == "node-2")["metadata"]["name"]
    api.delete(f"{NODES}/node-2")
    api.set_pod_status(lost, {"phase": "Failed", "reason": "NodeLost", "message": "node node-2 is gone"})
    pods = eventually(lambda: gang(api, "demo", 1, 2), timeout=30, what="a gang of the two that fit")
    assert sorted(pinned_node(pod) for pod in pods) == ["node-0", "node-1"]
    assert {env(pod)["HOROVOD_SIZE"] for pod in pods} == {"2"}
    status = api.status("demo")
    assert status["restarts"] == 1 and status["lastFailure"]["reason"] == "NodeLost"  # a failure, counted
    assert posted(api, "Resized", 1) == [("Warning", f"running 2 of 3 workers: {lost} (NodeLost) was lost")]


@pytest.mark.parametrize("cluster", [4], indirect=True)
def test_a_partly_scheduled_gang_runs_with_its_scheduled_part_after_the_timeout(cluster):
    """The scheduler's room is seen only in what it binds: two workers bound, the third refused
    for the gang scheduling timeout, the gang restarts with two, no failure counted."""
    api = cluster
    api.create_job("demo", {**SPEC, "workers": workers(), "placement": {"policy": "Scheduler"}})
    eventually(lambda: gang(api, "demo", 0, 3), what="the whole gang")
    for index in (0, 1):
        api.set_pod_status(f"demo-worker-{index}", {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]})
    refused = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes are available: 4 Insufficient cpu."}
    api.set_pod_status("demo-worker-2", {"phase": "Pending", "conditions": [refused]})
    pods = eventually(lambda: gang(api, "demo", 1, 2), timeout=30, what="a gang of the two scheduled")
    assert {env(pod)["HOROVOD_SIZE"] for pod in pods} == {"2"}
    status = api.status("demo")
    assert status["restarts"] == 0 and status.get("lastFailure") is None
    assert posted(api, "Resized", 1) == [
        ("Warning", f"running 2 of 3 workers: 1 stayed unschedulable for the gang scheduling timeout ({GANG_TIMEOUT_SECONDS} s)")
    ]


def elastic_job(api, rank0_port):
    """A gang of 3 down to 2 whose rank 0 says it trains elastic, all running."""
    api.create_job("demo", {**SPEC, "workers": workers(), "metrics": {"port": rank0_port}})
    eventually(lambda: gang(api, "demo", 0, 3), what="the whole gang")
    api.run_pods("demo", podIP="127.0.0.1")
    eventually(lambda: (api.status("demo").get("progress") or {}).get("elastic"), timeout=30, what="rank 0's word that it trains elastic")


@pytest.fixture
def elastic_rank0():
    """Rank 0's metrics endpoint, fed as the runtime feeds it once its script enters hvd.elastic.run."""
    port = free_port()
    rank0 = WorkerMetrics(rank=0)
    rank0.serve(port)
    rank0.record_step(12, 0.1, 1.2)
    rank0.record_elastic()
    return port


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_an_elastic_gang_goes_on_and_its_lost_worker_is_created_again(cluster, elastic_rank0):
    api = cluster
    elastic_job(api, elastic_rank0)
    api.set_pod_status("demo-worker-2", terminated(137, reason="OOMKilled"))
    [(kind, message)] = posted(api, "WorkerReplaced", 1)
    assert kind == "Warning" and "the elastic gang goes on with 2 of 3 workers" in message, message
    assert "demo-worker-2 is created again to rejoin it (1 of 3, spec.runPolicy.backoffLimit)" in message, message
    # The failed pod goes, and the same worker of the same gang comes back: no restart.
    eventually(lambda: (pods := gang(api, "demo", 0, 3)) and all((p.get("status") or {}).get("phase") != "Failed" for p in pods), timeout=30, what="worker 2 created again")
    status = api.status("demo")
    assert (status["phase"], status["restarts"], status["replacedWorkers"], status["replacing"]) == ("Running", 0, 1, ["demo-worker-2"])
    assert resized_condition(api, "demo")["status"] == "True"
    api.set_pod_status("demo-worker-2", {"phase": "Running", "podIP": "127.0.0.1"})
    assert posted(api, "WorkersReplaced", 1) == [("Normal", "demo-worker-2 running again; all 3 workers in the elastic gang")]
    eventually(lambda: api.status("demo").get("replacing") == [], what="no worker being replaced")
    assert resized_condition(api, "demo")["status"] == "False"
    assert api.events("WorkerReplaced") and len(api.events("WorkerReplaced")) == 1  # one Event for one loss


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_an_elastic_gangs_deleted_pod_is_created_again_without_a_restart(cluster, elastic_rank0):
    """A pod deleted (by someone, or evicted) is lost as a killed one is: its peers go on, and it
    comes back in the same gang. The cluster suite deletes one of a real elastic gang."""
    api = cluster
    elastic_job(api, elastic_rank0)
    api.delete("/api/v1/namespaces/default/pods/demo-worker-2")
    [(kind, message)] = posted(api, "WorkerReplaced", 1)
    assert kind == "Warning" and message.startswith("worker demo-worker-2 failed: PodDeleted;"), message
    assert "the elastic gang goes on with 2 of 3 workers" in message, message
    eventually(lambda: gang(api, "demo", 0, 3), timeout=30, what="worker 2 created again in gang 0")
    status = api.status("demo")
    assert (status["phase"], status["restarts"], status["replacedWorkers"]) == ("Running", 0, 1), status
    assert status["lastFailure"]["reason"] == "PodDeleted", status


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_an_elastic_gang_that_loses_worker_0_restarts_whole(cluster, elastic_rank0):
    """Worker 0 serves the rendezvous the others re-form at: without it the gang cannot go on."""
    api = cluster
    elastic_job(api, elastic_rank0)
    api.set_pod_status("demo-worker-0", terminated(137, reason="OOMKilled"))
    eventually(lambda: gang(api, "demo", 1, 3), timeout=30, what="a new gang")
    assert api.status("demo")["restarts"] == 1 and not api.events("WorkerReplaced")
