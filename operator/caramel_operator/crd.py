"""The CaramelJob CustomResourceDefinition, generated from the pydantic models in caramel.contract.api.

`python -m caramel_operator.crd` prints it; `make crd` writes the committed copies, and a test
fails when they drift from the models.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel

from caramel.contract.api import GROUP, JOB_NAME_MAX_LENGTH, KIND, VERSION, CaramelJobSpec, CaramelJobStatus

PLURAL = "carameljobs"
SINGULAR = "carameljob"
# Built-in resources win over a CRD's short names (`cj` is CronJob's): tests/contract/test_crd.py checks
# these against a real API server's discovery.
SHORT_NAMES = ["cmj"]

# Kept out of the structural schema: Kubernetes rejects or ignores them.
_DROPPED_KEYS = {"title", "additionalProperties", "$defs"}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.readyWorkers", "description": "Running over requested workers."},
    {
        "name": "Size",
        "type": "integer",
        "jsonPath": ".status.size.workers",
        "description": "Workers the gang runs with: spec.workers.replicas, or fewer (minReplicas) while they do not all fit.",
        "priority": 1,
    },
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Step Time", "type": "number", "jsonPath": ".status.progress.stepSeconds", "description": "Seconds per step."},
    {"name": "Bandwidth", "type": "string", "jsonPath": ".status.progress.bandwidth"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema for Kubernetes from a pydantic model's JSON schema."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(schema, schema.get("$defs", {}))


def _structural(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        # A field's own description wins over its type's.
        return _structural(merged, definitions)
    if "anyOf" in node:
        return _structural(_collapse_any_of(node), definitions)
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            # JSON Schema's exclusive bounds are numbers; OpenAPI v3.0's are flags on the bound.
            node = {**node, limit: node[bound], bound: True}
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}
    result = {key: _structural(value, definitions) for key, value in node.items() if key not in _DROPPED_KEYS}
    if isinstance(result.get("description"), str):
        result["description"] = " ".join(result["description"].split())  # docstrings wrap; explain re-wraps
    if node.get("type") == "object":
        extra = node.get("additionalProperties")
        if "properties" not in node and extra in (None, True, {}):
            # Free-form objects such as workers.template keep whatever they are given.
            result["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict) and extra:
            result["additionalProperties"] = _structural(extra, definitions)
        if "properties" in node and isinstance(node.get("default"), dict):
            # Nested objects default to {} and let their fields' own defaults apply.
            result["default"] = {}
    if result.get("default", 0) is None:
        del result["default"]
    return result


def _collapse_any_of(node: dict[str, Any]) -> dict[str, Any]:
    options = [option for option in node["anyOf"] if option.get("type") != "null"]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    types = {option.get("type") for option in options}
    if types == {"integer", "string"}:
        # Each member's own constraints (minimum, pattern) hold only for values of its type,
        # as OpenAPI's validators apply them, so they can sit side by side on one node.
        constraints = {k: v for option in options for k, v in option.items() if k != "type"}
        return {**constraints, **rest, "x-kubernetes-int-or-string": True}
    if len(options) == 1:
        return {**options[0], **rest}
    raise ValueError(f"cannot express anyOf {node['anyOf']} in a structural schema")


def custom_resource_definition() -> dict[str, Any]:
    spec_schema = openapi_schema(CaramelJobSpec)
    status_schema = openapi_schema(CaramelJobStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR, "shortNames": SHORT_NAMES},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A data-parallel TensorFlow training job run as a gang of Horovod workers.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version: caramel.dev/v1alpha1."},
                                "kind": {"type": "string", "description": "Kind: CaramelJob."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            "x-kubernetes-validations": [
                                {
                                    "rule": f"self.metadata.name.size() <= {JOB_NAME_MAX_LENGTH}",
                                    "message": f"metadata.name must be at most {JOB_NAME_MAX_LENGTH} characters: worker pods add a suffix",
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    # The header still names the models' old module: the committed copies (manifests/, helm/) change
    # with it, by `make crd`, when their owners regenerate them.
    return "# Generated from runtime/caramel/contract/api.py by `make crd`; do not edit.\n" + yaml.safe_dump(
        custom_resource_definition(), sort_keys=False, width=120
    )


if __name__ == "__main__":
    sys.stdout.write(render())
