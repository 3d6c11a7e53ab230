"""The CaramelJob API reference (docs/api.md), generated from the pydantic models in `caramel.contract.api`.

`python -m caramel.contract.reference` prints it; `make crd` writes docs/api.md beside the CRD, and
a test fails when the committed page drifts from the models. Every field's path, type, constraints,
default and docstring come from the models, so the page cannot say what the code does not.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from caramel.contract import api

SOURCE = "runtime/caramel/contract/api.py"


def _prose(text: str | None) -> str:
    """A docstring as one paragraph: docstrings wrap where the source does."""
    return " ".join((text or "").split())


def _member_docs(enum: type[Enum]) -> dict[str, str]:
    """The docstrings written under an enum's members (Python keeps none at run time)."""
    try:
        tree = ast.parse(inspect.getsource(enum))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for statement, following in zip(body, body[1:]):
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[getattr(enum, statement.targets[0].id).value] = _prose(following.value.value)
    return docs


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _is_quantity(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and annotation == api.Quantity


def _type_text(annotation: Any) -> str:
    annotation = _without_none(annotation)
    if _is_quantity(annotation):
        return "Kubernetes quantity (integer or string such as `2`, `500m`, `4Gi`)"
    if get_origin(annotation) is Annotated:
        return _type_text(get_args(annotation)[0])
    if get_origin(annotation) is Literal:
        return "`" + "` or `".join(str(value) for value in get_args(annotation)) + "`"
    if get_origin(annotation) is list:
        return f"list of {_type_text(get_args(annotation)[0])}"
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        return "object (free-form)" if value is Any else f"map of string to {_type_text(value)}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    names = {int: "integer", str: "string", bool: "boolean", float: "number"}
    if annotation in names:
        return names[annotation]
    if annotation is Any:
        return "any"
    raise ValueError(f"no reference text for the type {annotation!r}")


def _constraints(field: FieldInfo) -> list[str]:
    annotation = _without_none(field.annotation)
    unit = "items" if get_origin(annotation) is list else "characters"
    low = next((item.ge for item in field.metadata if isinstance(item, Ge)), None)
    high = next((item.le for item in field.metadata if isinstance(item, Le)), None)
    texts = [f"{low} to {high}"] if low is not None and high is not None else []
    for item in field.metadata:
        if isinstance(item, Ge) and high is None:
            texts.append(f"at least {item.ge}")
        elif isinstance(item, Gt):
            texts.append(f"more than {item.gt}")
        elif isinstance(item, Le) and low is None:
            texts.append(f"at most {item.le}")
        elif isinstance(item, Lt):
            texts.append(f"less than {item.lt}")
        elif isinstance(item, MinLen):
            texts.append("not empty" if item.min_length == 1 else f"at least {item.min_length} {unit}")
        elif isinstance(item, MaxLen):
            texts.append(f"at most {item.max_length} {unit}")
        elif getattr(item, "pattern", None):
            texts.append(api.PATTERN_MEANINGS.get(item.pattern, f"matching `{item.pattern}`"))
    return texts


def _default_text(field: FieldInfo) -> str:
    default = field.default
    if default is PydanticUndefined:
        return "required"
    if default is None:
        return "unset"
    if isinstance(default, BaseModel):
        return ""  # an object whose own fields carry the defaults
    if isinstance(default, Enum):
        return f"default `{default.value}`"
    if isinstance(default, bool):
        return f"default `{str(default).lower()}`"
    if default == [] or default == {}:
        return "default empty"
    if default == "":
        return 'default `""`'
    return f"default `{default}`"


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _without_none(annotation)
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _enum(annotation: Any) -> type[Enum] | None:
    annotation = _without_none(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, Enum) else None


def _rules(model: type[BaseModel]) -> list[str]:
    extra = model.model_config.get("json_schema_extra")
    rules = extra.get("x-kubernetes-validations") if isinstance(extra, dict) else None
    if not isinstance(rules, list):
        return []
    # The CRD's CEL validations (api.py), each {"rule": ..., "message": ...}.
    return [str(rule["message"]) for rule in rules if isinstance(rule, dict)]


def _section(path: str, model: type[BaseModel], lines: list[str]) -> None:
    lines += [f"### `{path}`", "", _prose(model.__doc__), ""]
    rules = _rules(model)
    if rules:
        lines += ["Rules: " + "; ".join(rules) + ".", ""]
    children: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        nested = _nested_model(field.annotation)
        is_list = get_origin(_without_none(field.annotation)) is list
        child_path = f"{path}.{key}" + ("[]" if is_list else "")
        facts = [_type_text(field.annotation), *_constraints(field), _default_text(field)]
        if nested is not None:
            facts[0] = facts[0].replace("object", f"object, see [`{child_path}`](#{_anchor(child_path)})")
            children.append((child_path, nested))
        lines.append(f"- **`{path}.{key}`** ({'; '.join(fact for fact in facts if fact)})")
        lines.append(f"  {_prose(field.description)}")
        enum = _enum(field.annotation)
        if enum is not None:
            for value, doc in _member_docs(enum).items():
                lines.append(f"  - `{value}`: {doc}")
    if getattr(model, "model_config", {}).get("extra") == "allow":
        lines.append(f"- Other fields of `{path}` are kept as they are.")
    lines.append("")
    for child_path, nested in children:
        _section(child_path, nested, lines)


def _anchor(path: str) -> str:
    """GitHub's heading anchor for a heading that is `path` in code."""
    return "".join(char for char in path.lower() if char.isalnum() or char in "-_ ").replace(" ", "-")


def _defaults_example() -> str:
    job = api.CaramelJob(metadata=api.ObjectMeta(name="example"), spec=api.CaramelJobSpec(script="train.py"))
    return yaml.safe_dump(job.model_dump(mode="json", by_alias=True), sort_keys=False, width=100)


def render() -> str:
    lines = [
        f"<!-- Generated from {SOURCE} by `make crd` (python -m caramel.contract.reference); do not edit. -->",
        "",
        "# The CaramelJob API",
        "",
        f"`{api.API_VERSION}`, kind `{api.KIND}`. One definition, the pydantic models in [`{SOURCE}`](../{SOURCE}), serves "
        "`caramel run`, the operator and the CRD (`manifests/crd.yaml`, which `kubectl explain carameljob.spec` "
        "reads). Field names are camelCase; unknown fields are errors, named with their path. "
        "\"unset\" is null or left out.",
        "",
        "A job with every field at its default (`script` or `command` is the one field `spec` needs):",
        "",
        "```yaml",
        _defaults_example().rstrip(),
        "```",
        "",
        "## The job",
        "",
    ]
    _section("metadata", api.ObjectMeta, lines)
    lines += ["## Spec", ""]
    _section("spec", api.CaramelJobSpec, lines)
    lines += ["## Status", "", "Written by the operator; `caramel run` writes none.", ""]
    _section("status", api.CaramelJobStatus, lines)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
