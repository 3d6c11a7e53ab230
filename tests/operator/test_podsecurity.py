"""Worker pods against the Pod Security Standards' "restricted" profile.

The checker (caramel_operator.podsecurity) follows Kubernetes' pod-security-admission checks; no
cluster runs here to admit pods, so each rule is shown to catch a pod that breaks it, and the
pods the builders make (with templates that stay within the rules) are shown to pass. What this
cannot see: the admission plugin's own version-specific quirks and exemptions, and the kubelet's
refusal of an image whose user is root when runAsUser is unset (the builders always set it).
"""

from __future__ import annotations

import copy

import pytest

from caramel.contract.jobfile import parse_job
from caramel_operator.builders import WORKER_UID, build_worker_pods
from caramel_operator.podsecurity import restricted_violations


def job(**spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo", "namespace": "ml"},
         "spec": {"script": "t.py", **spec}}
    )


ALLOWED_TEMPLATES = {
    "none": {},
    "checkpoint PVC and nodes": {"spec": {"nodeSelector": {"pool": "train"}, "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
                                          "containers": [{"name": "worker", "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}]}},
    "another non-root user": {"spec": {"securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 2000}}},
    "a hardened sidecar": {"spec": {"containers": [{"name": "sidecar", "image": "busybox", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}},
    "read-only root": {"spec": {"containers": [{"name": "worker", "securityContext": {"readOnlyRootFilesystem": True}}]}},
}


@pytest.mark.parametrize("template", ALLOWED_TEMPLATES.values(), ids=ALLOWED_TEMPLATES.keys())
def test_built_worker_pods_pass_restricted(template):
    for pod in build_worker_pods(job(workers={"replicas": 3, "slotsPerWorker": 2, "template": template}), default_image="caramel:1"):
        assert restricted_violations(pod["spec"], pod["metadata"]["annotations"]) == []


def test_worker_pods_run_as_the_image_user_with_volume_group_ownership():
    pod = build_worker_pods(job(), default_image="x")[0]
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == WORKER_UID
    assert security["fsGroup"] == WORKER_UID, "checkpoint volumes must be writable by the worker"
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


BASE = build_worker_pods(job(), default_image="x")[0]["spec"]


def broken(change) -> dict:
    spec = copy.deepcopy(BASE)
    change(spec)
    return spec


worker = lambda spec: spec["containers"][0]  # noqa: E731
BREAKS = {
    "hostNetwork": (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    "hostPID": (lambda s: s.update(hostPID=True), "hostPID"),
    "privileged": (lambda s: worker(s)["securityContext"].update(privileged=True), "containers[worker].securityContext.privileged"),
    "escalation": (lambda s: worker(s)["securityContext"].update(allowPrivilegeEscalation=True), "containers[worker].securityContext.allowPrivilegeEscalation"),
    "escalation unset": (lambda s: worker(s)["securityContext"].pop("allowPrivilegeEscalation"), "containers[worker].securityContext.allowPrivilegeEscalation"),
    "capabilities kept": (lambda s: worker(s)["securityContext"].pop("capabilities"), "containers[worker].securityContext.capabilities.drop"),
    "capability added": (lambda s: worker(s)["securityContext"]["capabilities"].update(add=["NET_RAW"]), "containers[worker].securityContext.capabilities.add"),
    "root user": (lambda s: s["securityContext"].update(runAsUser=0), "securityContext.runAsUser"),
    "root container": (lambda s: worker(s)["securityContext"].update(runAsUser=0), "containers[worker].securityContext.runAsUser"),
    "non-root unset": (lambda s: s["securityContext"].pop("runAsNonRoot"), "containers[worker].securityContext.runAsNonRoot"),
    "non-root false in container": (lambda s: worker(s)["securityContext"].update(runAsNonRoot=False), "containers[worker].securityContext.runAsNonRoot"),
    "seccomp unset": (lambda s: s["securityContext"].pop("seccompProfile"), "containers[worker].securityContext.seccompProfile.type"),
    "seccomp unconfined": (lambda s: worker(s)["securityContext"].update(seccompProfile={"type": "Unconfined"}), "containers[worker].securityContext.seccompProfile.type"),
    "hostPath volume": (lambda s: s.update(volumes=[{"name": "ckpt", "hostPath": {"path": "/ckpt"}}]), "volumes[ckpt]"),
    "nfs volume": (lambda s: s.update(volumes=[{"name": "data", "nfs": {"server": "nfs", "path": "/"}}]), "volumes[data]"),
    "host port": (lambda s: worker(s).update(ports=[{"name": "m", "containerPort": 9401, "hostPort": 9401}]), "containers[worker].ports[m].hostPort"),
    "unsafe sysctl": (lambda s: s["securityContext"].update(sysctls=[{"name": "net.core.somaxconn", "value": "1024"}]), "securityContext.sysctls"),
    "proc mount": (lambda s: worker(s)["securityContext"].update(procMount="Unmasked"), "containers[worker].securityContext.procMount"),
    "selinux user": (lambda s: s["securityContext"].update(seLinuxOptions={"user": "system_u"}), "securityContext.seLinuxOptions.user"),
    "apparmor unconfined": (lambda s: worker(s)["securityContext"].update(appArmorProfile={"type": "Unconfined"}), "containers[worker].securityContext.appArmorProfile.type"),
    "init container unhardened": (lambda s: s.update(initContainers=[{"name": "fetch", "image": "busybox"}]), "initContainers[fetch].securityContext.allowPrivilegeEscalation"),
    "probe to another host": (lambda s: worker(s).update(livenessProbe={"httpGet": {"host": "example.com", "port": 80}}), "containers[worker].livenessProbe.httpGet.host"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_each_restricted_rule_catches_a_pod_that_breaks_it(name):
    change, field = BREAKS[name]
    violations = restricted_violations(broken(change))
    assert field in [v.field for v in violations], violations
