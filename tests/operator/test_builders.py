"""Pure builders: the objects a CaramelJob becomes."""

from __future__ import annotations

from caramel.contract.jobfile import parse_job
from caramel.network.synthetic import racks
from caramel.network.wire import from_json
from caramel_operator.builders import build_service, build_worker_pod, worker_address
from caramel_operator.observe import WorkerState, observe_pod


def job(**spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo", "namespace": "ml"}, "spec": {"script": "t.py", **spec}}
    )


def env_of(pod):
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_workers_have_stable_names_dns_and_the_contract_env():
    pod = build_worker_pod(job(), 1, default_image="caramel:1")
    assert pod["metadata"]["name"] == "demo-worker-1"
    assert pod["spec"]["hostname"] == "demo-worker-1" and pod["spec"]["subdomain"] == "demo"
    assert worker_address(job(), 0) == "demo-worker-0.demo.ml.svc"
    assert env_of(pod)["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "demo-worker-0.demo.ml.svc"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["image"] == "caramel:1"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "caramel-operator"


def test_spec_image_resources_and_working_dir():
    pod = build_worker_pod(job(image="me/train:2", workingDir="/code", workers={"resources": {"limits": {"memory": "4Gi"}}}), 0, default_image="x")
    container = pod["spec"]["containers"][0]
    assert container["image"] == "me/train:2" and container["workingDir"] == "/code"
    assert container["resources"] == {"limits": {"memory": "4Gi"}}
    assert {"name": "rendezvous", "containerPort": 29400} in container["ports"]


def test_template_merges_but_cannot_break_the_wiring():
    template = {
        "metadata": {"labels": {"team": "vision", "caramel.dev/job": "hijack"}},
        "spec": {
            "nodeSelector": {"gpu": "a100"},
            "containers": [{"name": "worker", "env": [{"name": "EXTRA", "value": "1"}, {"name": "HOROVOD_SIZE", "value": "99"}]}, {"name": "sidecar", "image": "busybox"}],
        },
    }
    pod = build_worker_pod(job(workers={"replicas": 2, "template": template}), 0, default_image="x")
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["caramel.dev/job"] == "demo"
    assert pod["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "sidecar"]
    env = env_of(pod)
    assert env["HOROVOD_SIZE"] == "2" and env["EXTRA"] == "1"


def test_kueue_pod_group_when_a_queue_is_asked_for():
    pod = build_worker_pod(job(runPolicy={"schedulingPolicy": {"queue": "research"}}), 0, default_image="x", gang=3)
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "demo-gang-3"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    # Kueue's topology-aware scheduling orders the group's pods by the label this names: the rank.
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-pod-index-label"] == "caramel.dev/worker-index"
    assert pod["metadata"]["labels"]["caramel.dev/worker-index"] == "0"
    assert "kueue.x-k8s.io/queue-name" not in build_worker_pod(job(), 0, default_image="x")["metadata"]["labels"]
    # A gang running short (spec.workers.minReplicas) is a smaller group: Kueue admits what exists.
    elastic = job(workers={"replicas": 4, "minReplicas": 2}, runPolicy={"schedulingPolicy": {"queue": "research"}})
    short = build_worker_pod(elastic, 0, default_image="x", gang=3, replicas=3)
    assert short["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"


def test_headless_service_publishes_not_ready_workers():
    service = build_service(job())
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"caramel.dev/job": "demo"}


def test_observing_pods_round_trips_the_builders_labels():
    pod = build_worker_pod(job(), 1, default_image="x", gang=2)
    seen = observe_pod({**pod, "status": {"phase": "Running", "podIP": "10.0.0.7"}})
    assert (seen.index, seen.gang, seen.state, seen.pod_ip) == (1, 2, WorkerState.RUNNING, "10.0.0.7")
    assert observe_pod({"metadata": {"name": "other", "labels": {}}}) is None


def test_network_policy_admits_the_gang_the_operator_and_monitoring_only():
    from caramel_operator.builders import OPERATOR_POD_LABELS, build_network_policy

    policy = build_network_policy(job(workers={"slotsPerWorker": 2}), monitoring_namespace="monitoring", operator_namespace="caramel-system")
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "ml" and policy["metadata"]["labels"]["caramel.dev/job"] == "demo"
    assert spec["podSelector"] == {"matchLabels": {"caramel.dev/job": "demo"}} and spec["policyTypes"] == ["Ingress"]
    gang, metrics = spec["ingress"]
    # Gloo picks its ports at run time: the gang reaches each other on every port, nobody else does.
    assert gang == {"from": [{"podSelector": {"matchLabels": {"caramel.dev/job": "demo"}}}]}
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9401, "endPort": 9402}]
    operator, monitoring = metrics["from"]
    assert operator == {"podSelector": {"matchLabels": OPERATOR_POD_LABELS},
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "caramel-system"}}}
    assert monitoring == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    quiet = build_network_policy(job(metrics={"enabled": False}), monitoring_namespace="", operator_namespace="")
    assert len(quiet["spec"]["ingress"]) == 1


def test_worker_writes_its_final_report_where_kubernetes_reads_the_termination_message():
    pod = build_worker_pod(job(), 0, default_image="x")
    (container,) = pod["spec"]["containers"]
    assert env_of(pod)["CARAMEL_TERMINATION_MESSAGE_PATH"] == container["terminationMessagePath"] == "/dev/termination-log"


PIN = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}


def test_a_placed_worker_is_pinned_to_its_node_by_a_required_node_affinity():
    pod = build_worker_pod(job(), 0, default_image="x", node="node-7")
    assert pod["spec"]["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [PIN]}]}}
    }
    assert "affinity" not in build_worker_pod(job(), 0, default_image="x")["spec"]


def test_the_pin_joins_every_template_term_and_keeps_the_rest_of_the_templates_affinity():
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    named = {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}
    preferred = [{"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}
    template = {"spec": {"nodeSelector": {"pool": "train"}, "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [named]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAntiAffinity": anti,
    }}}
    pod = build_worker_pod(job(workers={"template": template}), 1, default_image="x", node="node-7")
    affinity = pod["spec"]["affinity"]
    # Terms are ORed: the pin is ANDed into each, so no term admits another node.
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [zone], "matchFields": [PIN]},
        {"matchFields": [named, PIN]},
    ]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAntiAffinity"] == anti and pod["spec"]["nodeSelector"] == {"pool": "train"}
    # The job's template itself is untouched.
    assert job(workers={"template": template}).spec.workers.template == template


def test_the_placed_topology_reaches_the_workers_environment():
    topology = racks(2, 2, bandwidth=1e9, uplink_bandwidth=2.5e8)
    pod = build_worker_pod(job(workers={"replicas": 4}), 3, default_image="x", topology=topology)
    assert from_json(env_of(pod)["CARAMEL_TOPOLOGY"]) == topology
    assert "CARAMEL_TOPOLOGY" not in env_of(build_worker_pod(job(workers={"replicas": 4}), 3, default_image="x"))


def test_a_gpu_worker_gets_the_gpu_nodes_tolerations_beside_its_templates_once_and_a_cpu_worker_none():
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    own = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
    template = {"spec": {"tolerations": [own, gpu_taint]}}
    gpus = job(workers={"slotsPerWorker": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}, "template": template})
    pod = build_worker_pod(gpus, 0, default_image="gpu:1", gpu_tolerations=[gpu_taint])
    assert pod["spec"]["tolerations"] == [own, gpu_taint]
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "2"}}  # a string, as the API writes it
    assert (env_of(pod)["CARAMEL_GPUS_PER_WORKER"], env_of(pod)["HOROVOD_LOCAL_SIZE"]) == ("2", "2")
    assert "tolerations" not in build_worker_pod(job(), 0, default_image="x", gpu_tolerations=[gpu_taint])["spec"]
