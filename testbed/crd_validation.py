"""A CustomResourceDefinition's validation, offline: what kube-apiserver checks when the CRD is
created and when an object of it is created, as far as libraries outside Go can.

- The OpenAPI v3.0 schema, with jsonschema's Draft 4 validator (OpenAPI 3.0's dialect: boolean
  exclusive bounds; `pattern` applies to strings only and `minimum` to numbers only, as on
  int-or-string quantities). Unknown fields are errors, as `kubectl apply` makes them by default
  (strict field validation); the API server alone would drop them silently.
- Every `x-kubernetes-validations` CEL rule, with cel-python, on each node whose value is there.
- Defaults: objects get the schema's defaults before they are validated, as the API server does;
  at CRD creation each node's `default` is validated against its own node, nested defaults NOT
  applied (that is how `default: {}` under an unguarded rule rejects the whole CRD).

What it cannot see, which a real API server checks: CEL type checking and cost budgets at CRD
creation (cel-python only parses), Kubernetes' CEL extension libraries (quantity(), url(), ...:
Caramel's rules use none, and an unknown function fails here too), `fieldPath`/`reason` syntax,
the structural-schema rules themselves, metadata validation (name formats, sizes), and RE2's
regular expression dialect (Python's `re` is used; Caramel's patterns are in the common subset).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
import jsonschema


@dataclass(frozen=True)
class Violation:
    path: str
    """The field, as a user writes it: spec.workers.replicas, spec.env[0].name."""
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def version_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def field_path(parts: Iterator[str | int] | list[str | int]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(object)"


# What the API server requires of every custom object's name (a DNS-1123 subdomain).
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_object(crd: dict[str, Any], obj: dict[str, Any]) -> list[Violation]:
    """What the API server would refuse in `obj` (a CaramelJob manifest), each naming its field."""
    names = crd["spec"]["names"]
    (version,) = crd["spec"]["versions"]
    api_version = f"{crd['spec']['group']}/{version['name']}"
    if obj.get("apiVersion") != api_version:
        return [Violation("apiVersion", f"no resource is served as {obj.get('apiVersion')!r}: expected {api_version}")]
    if obj.get("kind") != names["kind"]:
        return [Violation("kind", f"no matches for kind {obj.get('kind')!r} in {api_version}")]
    name = (obj.get("metadata") or {}).get("name", "")
    if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        return [Violation("metadata.name", f"{name!r} is not a DNS-1123 subdomain")]
    schema = version_schema(crd)
    value = with_defaults(schema, copy.deepcopy(obj))
    violations = schema_violations(schema, value)
    # As the API server: CEL rules run only on objects that pass the OpenAPI schema.
    return violations or rule_violations(schema, value, [])


def default_violations(crd: dict[str, Any]) -> list[Violation]:
    """What the API server would refuse in the CRD itself: each default against its own node."""
    violations = []
    for path, node in schema_nodes(version_schema(crd), []):
        if "default" in node:
            found = schema_violations(node, node["default"]) or rule_violations(node, node["default"], [])
            inside = lambda v: "" if v.path == "(object)" else f" at {v.path}"  # noqa: E731
            violations += [Violation(f"{field_path(path)} default{inside(v)}", v.message) for v in found]
    return violations


def rules(crd: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every x-kubernetes-validations rule with the schema path of its node."""
    return [
        (field_path(path), rule)
        for path, node in schema_nodes(version_schema(crd), [])
        for rule in node.get("x-kubernetes-validations", [])
    ]


def schema_nodes(node: dict[str, Any], path: list[str | int]) -> Iterator[tuple[list[str | int], dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, [*path, name])
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], [*path, "items"])
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], [*path, "additionalProperties"])


def with_defaults(node: dict[str, Any], value: Any) -> Any:
    """The value with the schema's defaults filled in, recursively, as the API server decodes it."""
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = with_defaults(child, value[name])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value.keys() - node.get("properties", {}).keys():
                value[key] = with_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        value = [with_defaults(node["items"], item) for item in value]
    return value


def schema_violations(node: dict[str, Any], value: Any) -> list[Violation]:
    validator = jsonschema.Draft4Validator(_strict(node))
    violations = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        path = list(error.absolute_path)
        if error.validator == "additionalProperties":
            known = error.schema.get("properties", {})
            violations += [Violation(field_path([*path, key]), "unknown field") for key in error.instance if key not in known]
        elif error.validator == "required":
            missing = [key for key in error.validator_value if key not in error.instance]
            violations += [Violation(field_path([*path, key]), "required field is missing") for key in missing]
        else:
            violations.append(Violation(field_path(path), error.message))
    return violations


def _strict(node: Any) -> Any:
    """The schema as the API server applies it: int-or-string typed, unknown fields errors
    (kubectl's strict field validation)."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {key: _strict(value) for key, value in node.items() if key != "default"}
    if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        result["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return result


def rule_violations(node: dict[str, Any], value: Any, path: list[str | int]) -> list[Violation]:
    violations: list[Violation] = []
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                violations += rule_violations(child, value[name], [*path, name])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value.keys() - node.get("properties", {}).keys():
                violations += rule_violations(extra, value[key], [*path, key])
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            violations += rule_violations(node["items"], item, [*path, index])
    for rule in node.get("x-kubernetes-validations", []):
        where = field_path([*path, *rule.get("fieldPath", "").strip(".").split(".")] if rule.get("fieldPath") else path)
        try:
            holds = evaluate(rule["rule"], value)
        except celpy.CELEvalError as error:
            violations.append(Violation(where, f"rule {rule['rule']!r} cannot be evaluated: {error.args[0]}"))
            continue
        if holds is not True:
            violations.append(Violation(where, rule.get("message") or f"failed rule: {rule['rule']}"))
    return violations


def evaluate(rule: str, value: Any) -> Any:
    result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return bool(result) if isinstance(result, celpy.celtypes.BoolType) else result


@cache
def _program(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))
