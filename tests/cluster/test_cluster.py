"""The portable cluster suite: runs against whatever cluster KUBECONFIG (or ~/.kube/config)
points at, with kubectl and helm from .venv/bin. Skips, saying why, where no cluster answers.

    KUBECONFIG=~/.kube/config .venv/bin/python -m pytest -m cluster tests/cluster

The cluster's nodes must be able to pull CARAMEL_IMAGE (default caramel:0.1.0: with kind,
`kind load docker-image caramel:0.1.0`; scripts/kind-e2e.sh does all of it), it needs a default
StorageClass for the checkpoint volume, and a CNI that enforces NetworkPolicy for that to mean
anything (the suite checks the objects, not the packets).

It covers the chart, jobs to Succeeded, the short name, restarts and resume, the operator's
restart, refusals, Pod Security, network policies, RBAC and placement (R-Storm's node affinities
as the real scheduler binds them, a gang too large for the cluster, the Scheduler policy); each
test has its own restricted namespace.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest
import yaml

from caramel_operator.cluster import PERMISSIONS, PLACEMENT_READS
from testbed.bad_jobs import HAND_WRITTEN
from testbed.cluster import IMAGE, RELEASE, REPO, Namespace, cluster_unavailable, kubectl, run, tool
from testbed.crd_validation import validate_object
from testbed.local_runs import digests
from testbed.operator_harness import eventually

UNAVAILABLE = cluster_unavailable()
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800), pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))]


@pytest.fixture(scope="session")
def operator_release() -> Iterator[str]:
    """The chart installed with its CRD, in its own namespace; uninstalled at the end."""
    namespace = f"{RELEASE}-system"
    repository, _, tag = IMAGE.rpartition(":")
    run(tool("helm"), "install", RELEASE, str(REPO / "helm" / "caramel"), "--namespace", namespace, "--create-namespace",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "crds.keep=false", "--wait", "--timeout", "5m", timeout=600)
    kubectl("wait", "--for=condition=Established", "crd/carameljobs.caramel.dev", "--timeout=60s")
    try:
        yield namespace
    finally:
        run(tool("helm"), "uninstall", RELEASE, "--namespace", namespace, "--wait", check=False, timeout=300)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def namespace(operator_release: str) -> Iterator[Namespace]:
    space = Namespace()
    try:
        yield space
    finally:
        space.delete()

PVC_EXAMPLE = list(yaml.safe_load_all((REPO / "examples" / "checkpoint-pvc.yaml").read_text()))


def checkpointed_job(name: str, steps: int = 120) -> list[dict]:
    """examples/checkpoint-pvc.yaml under another name, with a claim of its own."""
    claim, job = copy.deepcopy(PVC_EXAMPLE)
    claim["metadata"]["name"] = f"{name}-ckpt"
    job["metadata"]["name"] = name
    job["spec"]["image"] = IMAGE
    job["spec"]["args"] = ["--steps", str(steps)]
    job["spec"]["checkpoint"]["intervalSteps"] = 10
    job["spec"]["workers"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = f"{name}-ckpt"
    return [claim, job]


def final_digests(namespace, job: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for index in range(2):
        found |= digests(namespace.logs(f"{job}-worker-{index}"))
    return found


def test_the_chart_installs_the_crd_and_a_running_operator(operator_release):
    crd = yaml.safe_load(kubectl("get", "crd", "carameljobs.caramel.dev", "-o", "yaml").stdout)
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    kubectl("-n", operator_release, "rollout", "status", f"deployment/{RELEASE}-operator", "--timeout=120s")


def test_short_name_lists_caramel_jobs(namespace):
    resources = kubectl("api-resources", "--api-group=caramel.dev", "-o", "wide").stdout
    assert re.search(r"carameljobs\s+cmj\s", resources), resources
    namespace.apply(checkpointed_job("short", steps=20))
    listed = kubectl("get", "cmj", "-n", namespace.name, "-o", "name").stdout
    assert "carameljob.caramel.dev/short" in listed


def test_a_job_succeeds_in_a_restricted_namespace_with_progress_and_a_network_policy(namespace):
    namespace.apply(checkpointed_job("demo", steps=60))
    assert namespace.wait_for_phase("demo", {"Succeeded", "Failed"}) == "Succeeded", namespace.job("demo")
    status = namespace.job("demo")["status"]
    assert status["progress"]["step"] == 60, status
    events = kubectl("get", "events", "-n", namespace.name, "-o", "json").stdout
    assert "FailedCreate" not in events and "violates PodSecurity" not in events
    policy = namespace.get("networkpolicy", "demo")
    assert policy and policy["spec"]["podSelector"] == {"matchLabels": {"caramel.dev/job": "demo"}}
    assert policy["metadata"]["ownerReferences"][0]["name"] == "demo"


def test_a_deleted_pod_and_a_killed_worker_restart_the_gang_which_resumes(namespace):
    namespace.apply(checkpointed_job("straight", steps=120))
    assert namespace.wait_for_phase("straight", {"Succeeded", "Failed"}) == "Succeeded"
    expected = final_digests(namespace, "straight")
    assert len(set(expected.values())) == 1

    namespace.apply(checkpointed_job("resumed", steps=120))
    namespace.wait_for_phase("resumed", {"Running"})
    eventually(lambda: (namespace.job("resumed")["status"].get("progress") or {}).get("step", 0) >= 30, 600, "step 30", interval=2)
    kubectl("delete", "pod", "-n", namespace.name, "resumed-worker-1", "--wait=false")
    eventually(lambda: namespace.job("resumed")["status"].get("restarts", 0) >= 1, 300, "a restart after the pod deletion", interval=2)
    namespace.wait_for_phase("resumed", {"Running"})
    eventually(lambda: (namespace.job("resumed")["status"].get("progress") or {}).get("step", 0) >= 60, 600, "step 60", interval=2)
    # Kill the training process inside worker 0 (no procps in the image: /proc by hand).
    kill = ("import os, signal\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    if b'train_small.py' in open(f'/proc/{pid}/cmdline', 'rb').read(): os.kill(int(pid), signal.SIGKILL)")
    kubectl("exec", "-n", namespace.name, "resumed-worker-0", "--", "python", "-c", kill, check=False)
    eventually(lambda: namespace.job("resumed")["status"].get("restarts", 0) >= 2, 300, "a restart after the kill", interval=2)
    assert namespace.wait_for_phase("resumed", {"Succeeded", "Failed"}) == "Succeeded"
    assert "restored" in namespace.logs("resumed-worker-0")
    assert final_digests(namespace, "resumed") == expected


def test_an_operator_restart_mid_job_neither_duplicates_nor_orphans(namespace, operator_release):
    namespace.apply(checkpointed_job("steady", steps=200))
    namespace.wait_for_phase("steady", {"Running"})
    kubectl("delete", "pod", "-n", operator_release, "-l", "app.kubernetes.io/component=operator", "--wait=true")
    kubectl("-n", operator_release, "rollout", "status", f"deployment/{RELEASE}-operator", "--timeout=180s")
    assert namespace.wait_for_phase("steady", {"Succeeded", "Failed"}) == "Succeeded"
    job = namespace.job("steady")
    pods = namespace.pods("steady")
    assert sorted(p["metadata"]["name"] for p in pods) == ["steady-worker-0", "steady-worker-1"]
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"] for p in pods)
    assert job["status"]["restarts"] == 0


REFUSED = [bad for bad in HAND_WRITTEN if validate_object(yaml.safe_load((REPO / "manifests" / "crd.yaml").read_text()), bad.manifest)]


@pytest.mark.parametrize("bad", REFUSED, ids=lambda bad: bad.title)
def test_the_api_server_refuses_invalid_jobs_naming_the_field(namespace, bad):
    result = namespace.apply(bad.manifest, check=False)
    assert result.returncode != 0
    # The API server names the field as in the manifest (CEL rules by their node); a wrong
    # apiVersion or kind finds no resource: "no matches for kind ... in version ...".
    named = {"apiVersion": "in version", "kind": "no matches for kind"}.get(bad.field, bad.field.split("[")[0])
    assert named in result.stderr, result.stderr
    assert not namespace.pods(bad.manifest["metadata"]["name"])


def test_the_chart_rbac_answers_can_i_as_documented(operator_release):
    account = f"system:serviceaccount:{operator_release}:{RELEASE}-operator"
    for group, resource, verb in sorted(PERMISSIONS):
        target = f"{resource}.{group}" if group else resource
        answer = kubectl("auth", "can-i", verb, target, "--as", account, "-n", "default", check=False).stdout.strip()
        assert answer == "yes", f"{verb} {target}: {answer}"
    for group, resource, verb in sorted(PLACEMENT_READS):
        target = f"{resource}.{group}" if group else resource
        answer = kubectl("auth", "can-i", verb, target, "--as", account, "--all-namespaces", check=False).stdout.strip()
        assert answer == "yes", f"{verb} {target} cluster-wide: {answer}"
    for verb, target in (("get", "secrets"), ("create", "deployments.apps"), ("delete", "nodes")):
        answer = kubectl("auth", "can-i", verb, target, "--as", account, "-n", "default", check=False).stdout.strip()
        assert answer == "no", f"{verb} {target} should be denied"


def small_job(name: str, **spec) -> dict:
    """A short training job without volumes, so that any node may run it."""
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name},
            "spec": {"image": IMAGE, "script": "examples/train_small.py", "args": ["--steps", "20"],
                     "workers": {"replicas": 2, "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}},
                     **spec}}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_rstorm_places_the_gang_where_the_scheduler_binds_it(namespace):
    namespace.apply(small_job("placed"))
    assert namespace.wait_for_phase("placed", {"Succeeded", "Failed"}) == "Succeeded", namespace.job("placed")
    placement = namespace.job("placed")["status"]["placement"]
    assert placement["by"] == "RStorm" and len(placement["workers"]) == 2
    pods = sorted(namespace.pods("placed"), key=lambda pod: pod["metadata"]["name"])
    # The real scheduler honoured each required node affinity, and each worker got the topology.
    assert [pod["spec"]["nodeName"] for pod in pods] == [worker["node"] for worker in placement["workers"]]
    assert all(env_of(pod).get("CARAMEL_TOPOLOGY") for pod in pods)
    events = kubectl("get", "events", "-n", namespace.name, "--field-selector", "reason=Placed", "-o", "name").stdout
    assert events.strip(), "a Placed event"


def test_a_gang_larger_than_the_cluster_waits_and_says_why(namespace):
    huge = small_job("huge")
    huge["spec"]["workers"]["resources"] = {"requests": {"cpu": "250m", "memory": "64Ti"}}
    namespace.apply(huge)
    message = eventually(lambda: namespace.job("huge").get("status", {}).get("message", ""), 120, "a pending message", interval=2)
    assert message.startswith("cannot place the gang: cannot place 2 workers") and "short of memory" in message, message
    events = kubectl("get", "events", "-n", namespace.name, "--field-selector", "reason=Unplaceable", "-o", "name").stdout
    assert events.strip(), "an Unplaceable event"
    assert not namespace.pods("huge") and namespace.phase("huge") == "Pending"


def test_the_scheduler_policy_leaves_placement_to_kube_scheduler(namespace):
    namespace.apply(small_job("free", placement={"policy": "Scheduler"}))
    assert namespace.wait_for_phase("free", {"Succeeded", "Failed"}) == "Succeeded", namespace.job("free")
    assert namespace.job("free")["status"]["placement"]["by"] == "Scheduler"
    assert all("affinity" not in pod["spec"] and "CARAMEL_TOPOLOGY" not in env_of(pod) for pod in namespace.pods("free"))
