"""The CRD is generated from the API models; the committed copies must not drift from them, and
what a real API server checks of it and of CaramelJobs is checked here offline, with real
libraries: every CEL rule with cel-python (testbed/crd_validation.py says what that cannot see),
the OpenAPI schema with jsonschema, short names against a real API server's discovery."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import kmock
import pytest
import yaml

from caramel.contract.jobfile import JobFileError, parse_job
from caramel_operator.crd import PLURAL, SHORT_NAMES, SINGULAR, custom_resource_definition, render
from conftest import REPO
from testbed.bad_jobs import HAND_WRITTEN, fuzzed
from testbed.crd_validation import default_violations, rules, validate_object, version_schema

COMMITTED = ["manifests/crd.yaml", "helm/caramel/files/crd.yaml"]
EXAMPLE_JOBS = sorted(REPO.glob("examples/*.yaml")) + [REPO / "manifests" / "example-carameljob.yaml"]


@pytest.mark.parametrize("copy", COMMITTED)
def test_committed_crd_matches_the_models(copy):
    assert (REPO / copy).read_text() == render(), f"{copy} is stale: run `make crd`"


def schema():
    return custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def test_schema_is_structural():
    for path, node in walk(schema()):
        if isinstance(node, dict):
            assert not {"$ref", "anyOf", "title", "$defs"} & set(node), path


def test_docstrings_become_descriptions_for_kubectl_explain():
    spec = schema()["properties"]["spec"]
    assert spec["properties"]["workers"]["properties"]["slotsPerWorker"]["description"].startswith("Training processes per worker")
    assert spec["properties"]["runPolicy"]["properties"]["cleanPodPolicy"]["enum"] == ["None", "Running", "All"]


def test_defaults_and_cel_rules():
    spec = schema()["properties"]["spec"]
    assert spec["properties"]["workers"]["properties"]["replicas"]["default"] == 2
    assert spec["properties"]["workers"]["default"] == {}
    rules = [rule["rule"] for rule in spec["x-kubernetes-validations"]]
    assert {"has(self.script) || has(self.command)", "!(has(self.script) && has(self.command))"} <= set(rules)
    assert spec["properties"]["workers"]["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True


def test_names_status_and_printer_columns():
    crd = yaml.safe_load(render())
    assert crd["metadata"]["name"] == "carameljobs.caramel.dev"
    assert crd["spec"]["names"]["shortNames"] == ["cmj"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Ready", "Size", "Step", "Step Time", "Bandwidth", "Restarts", "Age"]


# --- what the API server checks: CEL rules, defaults, short names ---------------------------


def committed_crd(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


@pytest.mark.parametrize("path", COMMITTED)
def test_every_default_passes_the_schema_and_every_cel_rule(path):
    """kube-apiserver checks each node's default against that node, rules included, without
    applying nested defaults; `default: {}` under an unguarded rule made it refuse the CRD."""
    crd = committed_crd(path)
    assert len(rules(crd)) >= 3
    assert default_violations(crd) == []


def test_the_default_check_catches_an_unguarded_rule():
    crd = custom_resource_definition()
    caramel = version_schema(crd)["properties"]["spec"]["properties"]["caramel"]
    caramel["x-kubernetes-validations"][0]["rule"] = "self.minBucketBytes <= self.maxBucketBytes"
    (violation,) = default_violations(crd)
    assert violation.path == "spec.caramel default at minBucketBytes"
    assert "no such member" in violation.message


@pytest.mark.parametrize("path", EXAMPLE_JOBS, ids=lambda path: str(path.relative_to(REPO)))
def test_example_jobs_pass_the_crd(path):
    jobs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "CaramelJob"]
    assert jobs, f"{path} holds no CaramelJob"
    for job in jobs:
        assert validate_object(committed_crd(COMMITTED[0]), job) == []
        parse_job(job)


INVALID = HAND_WRITTEN + list(fuzzed(version_schema(custom_resource_definition()), 60, seed=9))


@pytest.mark.parametrize("bad", INVALID, ids=lambda bad: bad.title)
def test_invalid_jobs_are_refused_by_the_crd_and_the_models_naming_the_field(bad):
    violations = validate_object(committed_crd(COMMITTED[0]), bad.manifest)
    assert any(bad.field in str(violation) for violation in violations), violations
    with pytest.raises(JobFileError, match=bad.field.replace("[", r"\[").replace(".", r"\.")):
        parse_job(bad.manifest)


def test_a_cel_rule_holds_only_where_it_should():
    crd = custom_resource_definition()
    job = {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "x"}, "spec": {"script": "t.py"}}
    assert validate_object(crd, job) == []
    both = copy.deepcopy(job)
    both["spec"]["command"] = ["python"]
    assert [str(v) for v in validate_object(crd, both)] == ["spec: both script and command are set: give one of them"]
    neither = copy.deepcopy(job)
    del neither["spec"]["script"]
    assert [str(v) for v in validate_object(crd, neither)] == [
        "spec: neither script nor command is set: give one (script, a Python file every rank runs; or command, an argv list)"
    ]
    long_name = copy.deepcopy(job)
    long_name["metadata"]["name"] = "a" * 53
    assert "metadata.name must be at most 52 characters" in str(validate_object(crd, long_name))



@pytest.mark.parametrize(
    ("workers", "refused"),
    [({"replicas": 4, "minReplicas": 2}, False), ({"replicas": 4, "minReplicas": 4}, False), ({"minReplicas": 2}, False),
     ({"replicas": 4, "minReplicas": 5}, True), ({"minReplicas": 3}, True), ({"replicas": 4}, False)],
)
def test_min_replicas_may_not_exceed_replicas_whose_default_counts(workers, refused):
    """The API server fills in replicas' default (2) before the rule runs: minReplicas 3 alone is refused."""
    job = {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "x"}, "spec": {"script": "t.py", "workers": workers}}
    expected = ["spec.workers.minReplicas: minReplicas must not exceed replicas"] if refused else []
    assert [str(v) for v in validate_object(custom_resource_definition(), job)] == expected


def built_in_resource_names() -> dict[str, str]:
    """Every name of a built-in resource, from the discovery documents of a real API server that
    kmock ships (its `load_bundled()` resources), to the resource it names."""
    bundle = Path(kmock.__file__).parent / "_internal" / "resources.json.gz"
    names = {}
    for group in json.loads(gzip.decompress(bundle.read_bytes())):
        for resource in group["resources"]:
            if "/" in resource["name"]:
                continue
            what = f"{resource['name']} ({group['groupVersion']})"
            for name in [resource["name"], resource.get("singularName"), *resource.get("shortNames", [])]:
                if name:
                    names[name] = what
    return names


def test_short_names_collide_with_no_built_in_resource():
    built_in = built_in_resource_names()
    assert built_in["cj"] == "cronjobs (batch/v1)" and built_in["cm"] == "configmaps (v1)"  # the list is real
    assert len(built_in) > 100
    for name in [*SHORT_NAMES, PLURAL, SINGULAR]:
        assert name not in built_in, f"{name} is taken by {built_in.get(name)}"


def test_docs_and_scripts_use_the_short_name():
    """`kubectl get cj` lists CronJobs: nothing may tell users to type it."""
    texts = [REPO / "README.md", *REPO.glob("docs/*.md"), REPO / "manifests" / "README.md", *REPO.glob("helm/caramel/templates/*.txt"),
             *REPO.glob("scripts/*.sh"), *REPO.glob("examples/*.yaml"), *REPO.glob("tests/cluster/*.py")]
    for path in texts:
        text = path.read_text()
        assert " cj " not in text and " cj\n" not in text and "get cj" not in text, path
    assert f"kubectl get {SHORT_NAMES[0]}" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ({"resources": {"limits": {"nvidia.com/gpu": 2}}}, []),
        ({"slotsPerWorker": 2, "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": 2}}}, []),
        ({"slotsPerWorker": 4, "resources": {"limits": {"nvidia.com/gpu": 0}}}, []),
        (
            {"slotsPerWorker": 3, "resources": {"limits": {"nvidia.com/gpu": 2}}},
            ["spec.workers.slotsPerWorker: slotsPerWorker must not exceed the GPUs each worker asks for (resources.limits "
             "nvidia.com/gpu): each rank trains on a GPU of its own"],
        ),
        (
            {"resources": {"limits": {"nvidia.com/gpu": "1.5"}}},
            ["spec.workers.resources: limits.nvidia.com/gpu must be a whole number of GPUs, such as 1 or 8"],
        ),
        (
            {"resources": {"requests": {"nvidia.com/gpu": 1}}},
            ["spec.workers.resources: requests.nvidia.com/gpu needs the same number in limits: Kubernetes takes GPUs as limits"],
        ),
    ],
)
def test_the_api_server_refuses_gpu_counts_a_pod_or_a_rank_per_gpu_cannot_take(workers, expected):
    job = {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "x"}, "spec": {"script": "t.py", "workers": workers}}
    assert [str(v) for v in validate_object(custom_resource_definition(), job)] == expected
