"""docs/api.md is generated from the API models (`make crd`); the committed page must not drift
from them, and it must name every field, as the CRD does."""

from __future__ import annotations

from typing import get_origin

from pydantic import BaseModel

from caramel.contract import api
from caramel.contract.reference import _nested_model, _without_none, render
from conftest import REPO

PAGE = REPO / "docs" / "api.md"


def test_committed_api_reference_matches_the_models():
    assert PAGE.read_text() == render(), "docs/api.md is stale: run `make crd`"


def field_paths(path: str, model: type[BaseModel]) -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        nested = _nested_model(field.annotation)
        is_list = get_origin(_without_none(field.annotation)) is list
        child = f"{path}.{field.alias or name}"
        paths.append(child)
        if nested is not None:
            paths += field_paths(child + ("[]" if is_list else ""), nested)
    return paths


def test_every_field_has_its_path_and_docstring_on_the_page():
    page = render()
    paths = field_paths("spec", api.CaramelJobSpec) + field_paths("status", api.CaramelJobStatus)
    assert "spec.workers.minReplicas" in paths and "status.conditions[].reason" in paths
    for path in paths:
        assert f"**`{path}`**" in page, path
    for model in (api.Workers, api.Scheduling, api.CaramelJobStatus):
        for field in model.model_fields.values():
            assert field.description and " ".join(field.description.split()) in page, field.alias


def test_the_defaults_example_is_a_valid_job():
    import yaml

    from caramel.contract.jobfile import parse_job

    page = render()
    block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    job = parse_job(yaml.safe_load(block))
    assert job.spec.workers == api.Workers() and job.spec.caramel == api.Scheduling()
