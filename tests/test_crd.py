"""The CRD is generated from the API models; the committed copies must not drift from them."""

from __future__ import annotations

import pytest
import yaml

from caramel_operator.crd import custom_resource_definition, render
from conftest import REPO


@pytest.mark.parametrize("copy", ["manifests/crd.yaml", "helm/caramel/files/crd.yaml"])
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
    assert "has(self.script) != has(self.command)" in rules
    assert spec["properties"]["caramel"]["x-kubernetes-validations"][0]["rule"] == "self.minBucketBytes <= self.maxBucketBytes"
    assert spec["properties"]["workers"]["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True


def test_names_status_and_printer_columns():
    crd = yaml.safe_load(render())
    assert crd["metadata"]["name"] == "carameljobs.caramel.dev"
    assert crd["spec"]["names"]["shortNames"] == ["cj"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Ready", "Step", "Step Time", "Bandwidth", "Restarts", "Age"]
