"""The Helm chart and the install manifests, checked without a cluster.

`helm lint`, `helm template` of value variants and the values schema run the real helm (4.1, put
into .venv/bin by `make setup`). Every rendered object and every file in manifests/ is then
validated:
- built-in kinds (Deployment, Service, RBAC, CustomResourceDefinition, ...) against the
  Kubernetes 1.30 and 1.35 OpenAPI schemas that kubernetes-validate ships, in their strict form
  (unknown fields are errors). That covers fields, types, required fields and enums; it does not
  cover what only an API server checks (name formats, cross-field rules, defaults, admission);
- PodMonitor and ServiceMonitor, kinds of prometheus-operator's CRDs that kubernetes-validate has
  no schema for, against the pydantic models cloudcoil generates from those CRDs (prometheus-
  operator 0.80.1): types, required fields and enums; unknown fields are caught by comparing the
  object with what the model keeps of it;
- the example CaramelJob with Caramel's API models, which the CRD is generated from.
kubectl cannot help: without an API server it validates nothing, even client-side.

The operator's RBAC rules must grant exactly what the operator uses (caramel_operator.cluster,
checked against its recorded requests in tests/operator/test_operator_permissions.py), and the chart's
README must be the one helm/chart_readme.py generates from the values schema.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from caramel.contract.jobfile import load_job, parse_job
from caramel_operator.builders import OPERATOR_POD_LABELS, build_worker_pod
from caramel_operator.rbac import CRD_READS, NAMESPACE_READS, PERMISSIONS, PLACEMENT_READS
from caramel_operator.config import OperatorSettings
from caramel_operator.handlers import PROBE_LOOK_SECONDS
from caramel_operator.health import READINESS_PATH
from conftest import REPO, require_binary, runtime_metrics
from testbed.crd_validation import default_violations

CHART = REPO / "helm" / "caramel"
MANIFESTS = REPO / "manifests"
DASHBOARD = CHART / "dashboards" / "caramel-training.json"
RELEASE, NAMESPACE = "caramel", "caramel-system"
# The chart's ClusterRoles for release RELEASE, named as in manifests/.
OPERATOR_ROLE, DISCOVERY_ROLE = "caramel-operator", "caramel-operator-discovery"
USER_ROLES = {"caramel-edit": "edit", "caramel-view": "view"}
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the kubectl shipped here.
KUBERNETES_VERSIONS = ("1.30", "1.35")
OPERATOR_UID = 10001
# The images scripts/build-image.sh builds (Dockerfile targets operator and runtime), tagged with
# the chart's appVersion: the operator's Deployment runs the first, jobs without spec.image the second.
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
OPERATOR_IMAGE, RUNTIME_IMAGE = f"caramel-operator:{APP_VERSION}", f"caramel-runtime:{APP_VERSION}"

RUNTIME_METRICS = list(runtime_metrics())

# Values that exercise every value the chart templates in, schema-valid.
FULL_VALUES: dict[str, Any] = {
    "image": {"repository": "team/caramel", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull-secret"}],
    "runtimeImage": {"repository": "team/caramel-runtime", "tag": "0.1.0-rc2"},
    "crds": {"install": True, "keep": False},
    "serviceAccount": {"create": True, "name": "trainer", "annotations": {"example.com/role": "training"}},
    "rbac": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]},
    "networkPolicy": {"enabled": False, "monitoringNamespace": "observability"},
    "gangSchedulingTimeoutSeconds": 900,
    "topology": {"rackLabel": "example.com/rack", "links": {"rack": {"gbps": 25, "latencyUs": 20}, "zone": {"gbps": 10}}},
    "extraEnv": [{"name": "CARAMEL_RECONCILE_INTERVAL_SECONDS", "value": "5"}],
    "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
    "podAnnotations": {"example.com/scrape": "true"},
    "podLabels": {"team": "ml"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "service": {"type": "ClusterIP", "port": 9000},
    "monitoring": {
        "podMonitor": {"enabled": True, "namespace": "monitoring", "namespaceSelector": {"matchNames": ["team-a"]},
                       "labels": {"release": "prometheus"}, "interval": "10s", "ports": ["metrics-0", "metrics-1"],
                       "jobLabel": "caramel.dev/job", "targetLabels": ["caramel.dev/gang"],
                       "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}],
                       "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "caramel_bucket_.*", "action": "drop"}]},
        "serviceMonitor": {"enabled": True, "namespace": "monitoring", "namespaceSelector": {"any": True},
                           "labels": {"release": "prometheus"}, "interval": "1m", "jobLabel": "app.kubernetes.io/name",
                           "targetLabels": ["app.kubernetes.io/instance"],
                           "relabelings": [{"targetLabel": "team", "replacement": "ml"}],
                           "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "python_.*", "action": "drop"}]},
    },
    "grafana": {"dashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "ml"},
                              "annotations": {"grafana_folder": "Training"}}},
}

# FULL_VALUES as helm arguments: one --set-json per top-level key.
FULL_VALUES_ARGS = [arg for key, value in FULL_VALUES.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]

# The operator's ClusterRole (or its discovery ClusterRole when namespaced), and the users' edit and view roles.
BASE_KINDS = Counter(
    ServiceAccount=1, CustomResourceDefinition=1, ClusterRole=3, ClusterRoleBinding=1, Deployment=1, Service=1,
    ConfigMap=1,
)
# Value variants: helm arguments, and the kinds rendered.
VARIANTS: dict[str, tuple[list[str], Counter[str]]] = {
    "default": ([], BASE_KINDS),
    # The cluster-wide ClusterRole gives way to a Role per served namespace and a read-only ClusterRole.
    "namespaced": (["--set", "rbac.scope=namespaced"], BASE_KINDS + Counter(Role=1, RoleBinding=1)),
    "monitors": (
        ["--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true"],
        BASE_KINDS + Counter(PodMonitor=1, ServiceMonitor=1),
    ),
    "no-crds": (["--set", "crds.install=false"], BASE_KINDS - Counter(CustomResourceDefinition=1)),
    # The CRD goes with the release: the uninstall hook deletes the jobs first.
    "crd-not-kept": (["--set", "crds.keep=false"], BASE_KINDS + Counter(Job=1)),
    "no-dashboard": (["--set", "grafana.dashboard.enabled=false"], BASE_KINDS - Counter(ConfigMap=1)),
    "no-user-roles": (["--set", "rbac.userRoles=false"], BASE_KINDS - Counter(ClusterRole=2)),
    "full": (FULL_VALUES_ARGS, BASE_KINDS + Counter(Role=2, RoleBinding=2, PodMonitor=1, ServiceMonitor=1, Job=1)),
}


# --- tools -----------------------------------------------------------------------------------


def k8s_tool(name: str) -> str:
    """kubectl or helm from the virtualenv (`make setup` installs them there), else from PATH."""
    candidate = Path(sys.prefix) / "bin" / name
    path = str(candidate) if candidate.is_file() else shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `make setup` puts kubectl and helm into .venv/bin")
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([k8s_tool("helm"), *args], capture_output=True, text=True, timeout=60)


@cache
def render(*args: str) -> tuple[dict[str, Any], ...]:
    """The objects of `helm template` with these arguments (cached: treat them as read-only)."""
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return tuple(document for document in yaml.safe_load_all(result.stdout) if document)


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def only(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {variable["name"]: variable.get("value") for variable in container["env"]}


# --- validation ------------------------------------------------------------------------------


@cache
def prometheus_operator_models() -> Any:
    # Imported on first use: the generated models take about two seconds to build.
    from cloudcoil.models.prometheus_operator import v1

    return v1


def dropped_fields(original: Any, kept: Any, path: str = "") -> list[str]:
    """The paths of the fields of `original` missing from `kept`."""
    if isinstance(original, dict) and isinstance(kept, dict):
        return [
            dropped
            for key, value in original.items()
            for dropped in ([f"{path}{key}"] if key not in kept else dropped_fields(value, kept[key], f"{path}{key}."))
        ]
    if isinstance(original, list) and isinstance(kept, list):
        return [dropped for index, (a, b) in enumerate(zip(original, kept)) for dropped in dropped_fields(a, b, f"{path}{index}.")]
    return []


def validate(obj: dict[str, Any], kubernetes_version: str) -> None:
    """Validates one object against the schema of its kind; fails the test naming what is wrong."""
    what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    group = obj["apiVersion"].split("/")[0]
    if group == "monitoring.coreos.com":
        model = getattr(prometheus_operator_models(), obj["kind"])
        kept = model.model_validate(obj).model_dump(mode="json", by_alias=True, exclude_unset=True)
        unknown = dropped_fields(obj, kept)
        assert not unknown, f"{what}: fields unknown to prometheus-operator's {obj['kind']}: {unknown}"
        assert kept == obj, f"{what}: prometheus-operator's {obj['kind']} changes values: {kept}"
    elif group == "caramel.dev":
        parse_job(obj, source=what)
    else:
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            pytest.fail(f"{what} is invalid in Kubernetes {kubernetes_version} at {path}: {error.message}")


# --- helm lint and renders -------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], FULL_VALUES_ARGS], ids=["default", "full"])
def test_helm_lint_passes(values: list[str]) -> None:
    result = helm("lint", "--strict", str(CHART), *values)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_renders_the_expected_kinds(variant: str) -> None:
    args, expected = VARIANTS[variant]
    objects = render(*args)
    assert Counter(o["kind"] for o in objects) == expected


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_validate(variant: str, kubernetes_version: str) -> None:
    args, _ = VARIANTS[variant]
    for obj in render(*args, "--kube-version", kubernetes_version):
        validate(obj, kubernetes_version)


def test_chart_refuses_kubernetes_older_than_1_30() -> None:
    result = helm("template", RELEASE, str(CHART), "--kube-version", "1.29.0")
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--set", "rbac.scope=everywhere"], "/rbac/scope"),
        (["--set", "crds.instal=false"], "'instal'"),
        (["--set", "monitoring.podMonitor.enabled=yes"], "/monitoring/podMonitor/enabled"),
        (["--set", "service.port=0"], "/service/port"),
        (["--set", "resources.requests.memory=lots"], "/resources/requests/memory"),
        (["--set", "monitoring.serviceMonitor.interval=30"], "/monitoring/serviceMonitor/interval"),
        (["--set-json", 'rbac.watchNamespaces=["Not_A_Namespace"]'], "/rbac/watchNamespaces/0"),
        (["--set", "topology.rackLabel=my rack"], "/topology/rackLabel"),
        (["--set-json", 'topology.links={"rack": {"gbps": 0}}'], "/topology/links/rack/gbps"),
        (["--set-json", 'topology.links={"spine": {"gbps": 10}}'], "'spine'"),
        # runtimeImage was a string before the runtime had an image of its own.
        (["--set", "runtimeImage=caramel:0.1.0"], "/runtimeImage"),
    ],
    ids=["enum", "typo", "type", "range", "quantity", "duration", "namespace", "label-key", "link-speed", "link-level",
         "runtime-image-string"],
)
def test_values_schema_rejects_bad_values_naming_the_key(args: list[str], named: str) -> None:
    result = helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0
    assert "schema" in result.stderr and named in result.stderr, result.stderr


def test_watch_namespaces_need_the_namespaced_scope() -> None:
    result = helm("template", RELEASE, str(CHART), "--set-json", 'rbac.watchNamespaces=["team-a"]')
    assert result.returncode != 0
    assert "rbac.watchNamespaces is only for rbac.scope=namespaced" in result.stderr


def test_existing_service_account_must_be_named() -> None:
    result = helm("template", RELEASE, str(CHART), "--set", "serviceAccount.create=false")
    assert result.returncode != 0
    assert "serviceAccount.name" in result.stderr


def test_missing_helm_points_to_make_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(pytest.fail.Exception, match="make setup"):
        k8s_tool("no-such-tool")


# --- the manifests ---------------------------------------------------------------------------

MANIFEST_FILES = sorted(MANIFESTS.rglob("*.yaml"))


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda path: str(path.relative_to(MANIFESTS)))
def test_manifest_file_validates(path: Path, kubernetes_version: str) -> None:
    objects = load_yaml(path)
    assert objects, f"{path} holds no object"
    for obj in objects:
        validate(obj, kubernetes_version)


def test_manifests_install_into_the_operator_namespace() -> None:
    """`kubectl apply -f manifests/` (not recursive) installs the cluster-wide operator."""
    top_level = {path.name for path in MANIFESTS.glob("*.yaml")}
    assert top_level == {
        "crd.yaml", "namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "user-roles.yaml", "deployment.yaml", "service.yaml",
        "example-carameljob.yaml",
    }
    assert only(load_yaml(MANIFESTS / "namespace.yaml"), "Namespace")["metadata"]["name"] == NAMESPACE
    for name in ("serviceaccount.yaml", "deployment.yaml", "service.yaml"):
        for obj in load_yaml(MANIFESTS / name):
            assert obj["metadata"]["namespace"] == NAMESPACE, f"{name}: {obj['kind']}"
    binding = only(load_yaml(MANIFESTS / "rbac.yaml"), "ClusterRoleBinding")
    account = only(load_yaml(MANIFESTS / "serviceaccount.yaml"), "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
    readme = (MANIFESTS / "README.md").read_text()
    assert "kubectl apply -f manifests/crd.yaml -f manifests/namespace.yaml" in readme


def test_example_job_is_a_valid_caramel_job() -> None:
    job = load_job(MANIFESTS / "example-carameljob.yaml")
    assert job.spec.script == "examples/train_small.py"
    assert (REPO / job.spec.script).is_file()
    assert job.spec.args == ["--steps", "200"]
    assert job.spec.workers.replicas == 2
    assert job.spec.image == RUNTIME_IMAGE
    assert job.spec.workers.resources.requests and job.spec.workers.resources.limits


def test_crd_copies_are_identical() -> None:
    assert (MANIFESTS / "crd.yaml").read_text() == (CHART / "files" / "crd.yaml").read_text()


# --- the operator's Deployment ---------------------------------------------------------------


OPERATOR_DEPLOYMENTS = {
    "manifests": lambda: only(load_yaml(MANIFESTS / "deployment.yaml"), "Deployment"),
    "chart": lambda: only(render(), "Deployment"),
    "chart-full-values": lambda: only(render(*FULL_VALUES_ARGS), "Deployment"),
}


@pytest.mark.parametrize("source", OPERATOR_DEPLOYMENTS)
def test_operator_deployment_is_hardened(source: str) -> None:
    deployment = OPERATOR_DEPLOYMENTS[source]()
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == OPERATOR_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == OPERATOR_UID
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security and "hostNetwork" not in pod and "hostPID" not in pod

    assert container["command"] == ["python", "-m", "caramel_operator"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": 8000, "health": 8080}
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    assert (liveness["httpGet"]["path"], ports[liveness["httpGet"]["port"]]) == ("/healthz", 8080)
    assert (readiness["httpGet"]["path"], ports[readiness["httpGet"]["port"]]) == (READINESS_PATH, 8000)
    # Each probe lists the jobs: the operator bounds that list to answer within the kubelet's timeout.
    assert liveness["timeoutSeconds"] > PROBE_LOOK_SECONDS and readiness["timeoutSeconds"] > PROBE_LOOK_SECONDS
    env = env_of(deployment)
    assert env["CARAMEL_OPERATOR_METRICS_PORT"] == "8000"
    assert env["CARAMEL_OPERATOR_HEALTH_PORT"] == "8080"
    assert env["CARAMEL_RUNTIME_IMAGE"]
    assert {"requests", "limits"} <= container["resources"].keys()

    # /tmp, the only place the operator writes to, is an emptyDir.
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


@pytest.mark.parametrize("source", ["manifests", "chart"])
def test_the_operator_runs_in_its_image_and_jobs_in_the_runtime_image(source: str) -> None:
    """The operator's image holds no TensorFlow: the Deployment runs it, and sends jobs that set no
    spec.image to the workers' image. Both are the images scripts/build-image.sh builds."""
    deployment = OPERATOR_DEPLOYMENTS[source]()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == OPERATOR_IMAGE
    assert env_of(deployment)["CARAMEL_RUNTIME_IMAGE"] == RUNTIME_IMAGE
    build_script = (REPO / "scripts" / "build-image.sh").read_text()
    assert f'OPERATOR_IMAGE="{OPERATOR_IMAGE}"' in build_script and f'RUNTIME_IMAGE="{RUNTIME_IMAGE}"' in build_script


def test_runtime_image_tag_defaults_to_the_app_version() -> None:
    deployment = only(render("--set", "runtimeImage.repository=registry.example.com/caramel-runtime"), "Deployment")
    assert env_of(deployment)["CARAMEL_RUNTIME_IMAGE"] == f"registry.example.com/caramel-runtime:{APP_VERSION}"


def test_chart_defaults_match_the_manifests() -> None:
    """With default values the chart deploys what manifests/ does."""
    chart = only(render(), "Deployment")["spec"]["template"]["spec"]
    manifests = only(load_yaml(MANIFESTS / "deployment.yaml"), "Deployment")["spec"]["template"]["spec"]
    assert chart["securityContext"] == manifests["securityContext"]
    assert chart["volumes"] == manifests["volumes"]
    (chart_container,), (manifest_container,) = chart["containers"], manifests["containers"]
    for field in ("image", "command", "ports", "livenessProbe", "readinessProbe", "resources", "securityContext", "volumeMounts", "env"):
        assert chart_container[field] == manifest_container[field], field
    chart_rules = only(render(), "ClusterRole", OPERATOR_ROLE)["rules"]
    assert chart_rules == only(load_yaml(MANIFESTS / "rbac.yaml"), "ClusterRole")["rules"]


def test_full_values_reach_the_deployment() -> None:
    deployment = only(render(*FULL_VALUES_ARGS), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "team/caramel:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == FULL_VALUES["resources"]
    env = env_of(deployment)
    assert env["CARAMEL_RUNTIME_IMAGE"] == "team/caramel-runtime:0.1.0-rc2"
    assert env["CARAMEL_WATCH_NAMESPACES"] == "team-a,team-b"
    assert env["CARAMEL_RECONCILE_INTERVAL_SECONDS"] == "5"
    settings = OperatorSettings.from_env({k: v for k, v in env.items() if v is not None})
    assert settings.network_policy is False and settings.monitoring_namespace == "observability"
    assert settings.gang_scheduling_timeout_seconds == 900
    assert settings.rack_label == "example.com/rack"
    assert (settings.links.rack.gbps, settings.links.rack.latency_us, settings.links.zone.gbps) == (25, 20, 10)
    assert pod["serviceAccountName"] == "trainer"
    for field in ("imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations", "affinity"):
        assert pod[field] == FULL_VALUES[field], field
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml"


# --- RBAC ------------------------------------------------------------------------------------

# What kopf reads at cluster scope when confined to namespaces, and nothing more.
DISCOVERY_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]
# What R-Storm placement reads beyond the operator's rules: only the cluster scope grants it.
PLACEMENT_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]


def test_cluster_scope_grants_the_operator_rules_cluster_wide() -> None:
    objects = render()
    assert env_of(only(objects, "Deployment"))["CARAMEL_WATCH_NAMESPACES"] == ""
    role = only(objects, "ClusterRole", OPERATOR_ROLE)
    rules = role["rules"]
    # Cluster-wide, kopf reads CRDs but never lists namespaces.
    assert DISCOVERY_RULES[0] in rules and DISCOVERY_RULES[1] not in rules
    # Least privilege: no wildcards, no secrets, nothing beyond the operator's kinds.
    granted = {resource for rule in rules for resource in rule["resources"]}
    assert granted == {"carameljobs", "carameljobs/status", "pods", "services", "networkpolicies", "podgroups", "events", "customresourcedefinitions", "nodes"}
    assert PLACEMENT_RULES[0] in rules
    assert all("*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"] for rule in rules)
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = only(objects, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]


def test_namespaced_scope_serves_the_release_namespace_by_default() -> None:
    objects = render("--set", "rbac.scope=namespaced")
    assert env_of(only(objects, "Deployment"))["CARAMEL_WATCH_NAMESPACES"] == NAMESPACE
    assert only(objects, "Role")["metadata"]["namespace"] == NAMESPACE
    assert only(objects, "RoleBinding")["metadata"]["namespace"] == NAMESPACE
    assert only(objects, "ClusterRole", DISCOVERY_ROLE)["rules"] == DISCOVERY_RULES


def test_namespaced_scope_grants_a_role_in_each_watched_namespace() -> None:
    objects = render(*FULL_VALUES_ARGS)
    cluster_rules = only(load_yaml(MANIFESTS / "rbac.yaml"), "ClusterRole")["rules"]
    namespaced_rules = [rule for rule in cluster_rules if rule not in DISCOVERY_RULES + PLACEMENT_RULES]
    roles = [o for o in objects if o["kind"] == "Role"]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    assert all(role["rules"] == namespaced_rules for role in roles)
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": NAMESPACE}]
    assert only(objects, "ClusterRole", DISCOVERY_ROLE)["rules"] == DISCOVERY_RULES
    monitor = only(render("--set-json", 'rbac={"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]}',
                          "--set", "monitoring.podMonitor.enabled=true"), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_namespaced_manifest_matches_the_chart() -> None:
    manifest = load_yaml(MANIFESTS / "namespaced" / "rbac-namespaced.yaml")
    chart = render("--set", "rbac.scope=namespaced")
    assert only(manifest, "Role")["rules"] == only(chart, "Role")["rules"]
    assert only(manifest, "ClusterRole")["rules"] == DISCOVERY_RULES
    role_binding, cluster_binding = only(manifest, "RoleBinding"), only(manifest, "ClusterRoleBinding")
    assert role_binding["metadata"]["namespace"] == only(manifest, "Role")["metadata"]["namespace"]
    for binding in (role_binding, cluster_binding):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "caramel-operator", "namespace": NAMESPACE}]


# --- selectors: the operator, its workers and the monitors -----------------------------------


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.fixture(scope="module")
def worker_pod() -> dict[str, Any]:
    """A worker pod as the operator builds it, for a job named like the release."""
    job = parse_job({"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob",
                     "metadata": {"name": RELEASE, "namespace": "team-a"},
                     "spec": {"script": "examples/train_small.py", "workers": {"replicas": 2, "slotsPerWorker": 2}}})
    return build_worker_pod(job, 0, default_image=RUNTIME_IMAGE)


def test_operator_selectors_keep_worker_pods_out(worker_pod: dict[str, Any]) -> None:
    for objects in (render(), load_yaml(MANIFESTS / "deployment.yaml") + load_yaml(MANIFESTS / "service.yaml")):
        deployment, service = only(objects, "Deployment"), only(objects, "Service")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
        assert selects(service["spec"]["selector"], pod_labels)
        assert not selects(deployment["spec"]["selector"]["matchLabels"], worker_pod["metadata"]["labels"])
        assert not selects(service["spec"]["selector"], worker_pod["metadata"]["labels"])


def test_pod_monitor_scrapes_the_workers_metrics_ports(worker_pod: dict[str, Any]) -> None:
    monitor = only(render(*FULL_VALUES_ARGS), "PodMonitor")
    assert selects(monitor["spec"]["selector"]["matchLabels"], worker_pod["metadata"]["labels"])
    (container,) = worker_pod["spec"]["containers"]
    worker_ports = {port["name"] for port in container["ports"]}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [endpoint["port"] for endpoint in endpoints] == ["metrics-0", "metrics-1"]
    assert {endpoint["port"] for endpoint in endpoints} <= worker_ports
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    default = only(render("--set", "monitoring.podMonitor.enabled=true"), "PodMonitor")
    assert default["spec"]["namespaceSelector"] == {"any": True}
    assert [endpoint["port"] for endpoint in default["spec"]["podMetricsEndpoints"]] == ["metrics-0"]
    assert default["metadata"]["namespace"] == NAMESPACE


def test_monitors_take_the_dask_charts_options() -> None:
    """Namespace, namespaceSelector, jobLabel, target labels and both relabelings, as the Dask
    operator's chart has them; the chart's own relabeling (caramel_job) stays first."""
    objects = render(*FULL_VALUES_ARGS)
    for kind, key, target_labels in (("PodMonitor", "podMonitor", "podTargetLabels"), ("ServiceMonitor", "serviceMonitor", "targetLabels")):
        values, monitor = FULL_VALUES["monitoring"][key], only(objects, kind)
        assert monitor["metadata"]["namespace"] == values["namespace"], kind
        assert monitor["spec"]["namespaceSelector"] == values["namespaceSelector"], kind
        assert monitor["spec"]["jobLabel"] == values["jobLabel"], kind
        assert monitor["spec"][target_labels] == values["targetLabels"], kind
        for endpoint in monitor["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]:
            chart_own = [{"sourceLabels": ["__meta_kubernetes_pod_label_caramel_dev_job"], "targetLabel": "caramel_job"}] if kind == "PodMonitor" else []
            assert endpoint["relabelings"] == chart_own + values["relabelings"], kind
            assert endpoint["metricRelabelings"] == values["metricRelabelings"], kind


def test_service_monitor_scrapes_the_operator_service() -> None:
    objects = render("--set", "monitoring.serviceMonitor.enabled=true")
    monitor, service = only(objects, "ServiceMonitor"), only(objects, "Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # Found wherever the monitor itself is put (monitoring.serviceMonitor.namespace).
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}


# --- the CRD and the dashboard ---------------------------------------------------------------


def test_chart_installs_the_generated_crd_and_keeps_it() -> None:
    crd = only(render(), "CustomResourceDefinition")
    generated = only(load_yaml(CHART / "files" / "crd.yaml"), "CustomResourceDefinition")
    assert crd["spec"] == generated["spec"]
    assert crd["metadata"]["name"] == generated["metadata"]["name"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    crd = only(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


def test_a_release_whose_crd_goes_with_it_deletes_the_jobs_first_as_the_operator_hardened() -> None:
    """Issue 50: `helm uninstall --wait` with crds.keep=false left the CRD Terminating, its jobs
    holding the operator's finalizer once the operator had gone."""
    assert [o for o in render() if o["kind"] == "Job"] == []  # the CRD is kept, and its jobs with it
    objects = render("--set", "crds.keep=false", "--set", "rbac.scope=namespaced", "--set-json", 'rbac.watchNamespaces=["team-a","team-b"]')
    hook = only(objects, "Job")
    assert hook["metadata"]["annotations"] == {"helm.sh/hook": "pre-delete", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
    pod = hook["spec"]["template"]["spec"]
    operator = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == operator["serviceAccountName"]  # the operator's rights on CaramelJobs
    assert pod["securityContext"] == operator["securityContext"] and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    (operator_container,) = operator["containers"]
    assert container["command"] == ["python", "-m", "caramel_operator.uninstall"]
    assert (container["image"], container["securityContext"]) == (operator_container["image"], operator_container["securityContext"])
    assert env_of(hook)["CARAMEL_WATCH_NAMESPACES"] == env_of(only(objects, "Deployment"))["CARAMEL_WATCH_NAMESPACES"] == "team-a,team-b"
    # Its labels leave it out of the operator's selectors.
    assert hook["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "uninstall"


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_config_map_holds_the_dashboard() -> None:
    config_map = only(render(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["caramel-training.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_charts_every_runtime_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = dashboard_expressions(dashboard)
    for metric in RUNTIME_METRICS:
        assert any(metric in expr for expr in expressions), f"no panel uses {metric}"
    step_time = next(p for p in dashboard["panels"] if p["title"].startswith("Step time by rank"))
    quantiles = [t["expr"] for t in step_time["targets"]]
    assert [q.split(",")[0] for q in quantiles] == ["histogram_quantile(0.5", "histogram_quantile(0.95"]
    assert all("by (rank, le)" in q and "caramel_step_duration_seconds_bucket" in q for q in quantiles)
    # The job filter relies on the label the PodMonitor's relabeling adds.
    assert all("caramel_job=~" in expr for expr in expressions if "caramel_operator_" not in expr)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every query, with Grafana's variables replaced by what Grafana sends."""
    promtool = require_binary("promtool")
    grafana_variables = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": ".*", "$caramel_job": ".*"}
    rules = []
    for index, expr in enumerate(dashboard_expressions(json.loads(DASHBOARD.read_text()))):
        for variable, value in grafana_variables.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    rules_file = tmp_path / "dashboard-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"SUCCESS: {len(rules)} rules found", result.stdout), result.stdout


# --- what the operator needs, granted; what it builds, admitted ------------------------------

RBAC_VARIANTS = {
    "chart cluster": lambda: render(),
    "chart namespaced": lambda: render("--set", "rbac.scope=namespaced"),
    "chart full": lambda: render(*FULL_VALUES_ARGS),
    "manifests": lambda: load_yaml(MANIFESTS / "rbac.yaml"),
    "manifests namespaced": lambda: load_yaml(MANIFESTS / "namespaced" / "rbac-namespaced.yaml"),
}


def granted_by(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) a Role or ClusterRole grants."""
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def granted(objects: Iterable[dict[str, Any]], namespace: str | None) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the operator's ServiceAccount may use in `namespace` (None: what it
    may use cluster-wide): the rules of the roles bound to it there."""
    objects = list(objects)
    bound = {
        (binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for binding in objects
        if binding["kind"] == "ClusterRoleBinding" or (binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == namespace)
    }
    roles = [
        obj for obj in objects
        if (obj["kind"], obj["metadata"]["name"]) in bound and (obj["kind"] == "ClusterRole" or obj["metadata"]["namespace"] == namespace)
    ]
    return set().union(*map(granted_by, roles))


@pytest.mark.parametrize("variant", RBAC_VARIANTS)
def test_every_rbac_variant_grants_exactly_what_the_operator_uses(variant: str) -> None:
    """Too little failed silently (ttlSecondsAfterFinished without `delete` on carameljobs); too
    much was granted for years (`patch` on pods and Services, `update` on jobs, the events.k8s.io
    API), which the code never used. Cluster-wide the operator also reads CRDs and, for R-Storm
    placement, nodes and every namespace's pods; confined to namespaces it reads CRDs and the
    namespaces at cluster scope, and neither nodes nor other namespaces' pods, so its Auto jobs
    are placed by the scheduler."""
    objects = RBAC_VARIANTS[variant]()
    served = {o["metadata"]["namespace"] for o in objects if o["kind"] == "Role"}
    if not served:
        assert granted(objects, None) == PERMISSIONS | CRD_READS | PLACEMENT_READS
        return
    cluster_wide = granted(objects, None)
    assert cluster_wide == CRD_READS | NAMESPACE_READS
    for namespace in served:
        assert granted(objects, namespace) - cluster_wide == PERMISSIONS, f"{variant} in {namespace}"


@pytest.mark.parametrize("source", ["chart", "manifests"])
def test_user_roles_aggregate_editing_and_viewing_caramel_jobs(source: str) -> None:
    """Users bound to Kubernetes' admin or edit role in a namespace could not create CaramelJobs
    there without a custom Role."""
    objects = render() if source == "chart" else load_yaml(MANIFESTS / "user-roles.yaml")
    roles = {name: only(objects, "ClusterRole", name) for name in USER_ROLES}
    aggregated = {name: {key.rsplit("-", 1)[-1] for key, value in role["metadata"]["labels"].items()
                         if key.startswith("rbac.authorization.k8s.io/aggregate-to-") and value == "true"}
                  for name, role in roles.items()}
    assert aggregated == {"caramel-edit": {"admin", "edit"}, "caramel-view": {"view"}}
    edit, view = (granted_by(roles[name]) for name in USER_ROLES)
    assert {(resource, verb) for _, resource, verb in view} == {
        (resource, verb) for resource in ("carameljobs", "carameljobs/status") for verb in ("get", "list", "watch")
    }
    assert view < edit and ("caramel.dev", "carameljobs", "create") in edit and ("caramel.dev", "carameljobs/status", "patch") not in edit
    assert not any(o["kind"].endswith("Binding") for o in objects if o["metadata"]["name"] in USER_ROLES)
    assert [role for role in render("--set", "rbac.userRoles=false") if role["metadata"]["name"] in USER_ROLES] == []
    if source == "chart":
        assert [granted_by(only(load_yaml(MANIFESTS / "user-roles.yaml"), "ClusterRole", name)) for name in USER_ROLES] == [edit, view]


def test_network_policy_admits_the_operator_pods_of_chart_and_manifests() -> None:
    for deployment in (only(render(), "Deployment"), only(load_yaml(MANIFESTS / "deployment.yaml"), "Deployment")):
        assert selects(OPERATOR_POD_LABELS, deployment["spec"]["template"]["metadata"]["labels"])
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["CARAMEL_OPERATOR_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert env["CARAMEL_NETWORK_POLICY"]["value"] == "true"


def test_chart_crd_is_accepted_by_the_api_server_rules() -> None:
    """helm install failed on the CRD's CEL rule evaluated on its own default."""
    assert default_violations(only(render(), "CustomResourceDefinition")) == []


def test_notes_point_to_the_chart_crd() -> None:
    result = helm("install", RELEASE, str(CHART), "--dry-run", "--namespace", NAMESPACE, "--set", "crds.install=false")
    assert result.returncode == 0, result.stderr
    assert "files/crd.yaml" in result.stdout and "get cmj" in result.stdout


# --- the chart's README ----------------------------------------------------------------------


def test_the_chart_readme_is_generated_from_the_values_schema() -> None:
    """Every value is described in values.schema.json (the generator refuses one without), and the
    committed README is what helm/chart_readme.py makes of it and values.yaml."""
    result = subprocess.run([sys.executable, str(REPO / "helm" / "chart_readme.py"), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    readme = (CHART / "README.md").read_text()
    assert "| `monitoring.podMonitor.metricRelabelings` | `[]` |" in readme and "| `rbac.userRoles` | `true` |" in readme


def test_the_chart_readme_check_fails_on_drift(tmp_path: Path) -> None:
    copy = tmp_path / "helm"
    shutil.copytree(REPO / "helm", copy)
    values = copy / "caramel" / "values.yaml"
    values.write_text(values.read_text().replace("gangSchedulingTimeoutSeconds: 300", "gangSchedulingTimeoutSeconds: 301"))
    result = subprocess.run([sys.executable, str(copy / "chart_readme.py"), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "README.md is out of date" in result.stderr
