"""Pure builders: the objects a CaramelJob becomes."""

from __future__ import annotations

from caramel.job.jobfile import parse_job
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
    assert "kueue.x-k8s.io/queue-name" not in build_worker_pod(job(), 0, default_image="x")["metadata"]["labels"]


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
