"""Reading a CaramelJob from YAML, with errors that name the offending field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml

from caramel.contract.api import PATTERN_MEANINGS, CaramelJob


FORMER_ABLATION_FIELDS = ("ordering", "batching", "collective")
"""spec.caramel's fields until the ablations left the CaramelJob API for the benchmarks' planning
policies (`caramel.planner.policy`): a job file written for an earlier version names them."""


class JobFileError(Exception):
    """A job file that cannot be read or is not a valid CaramelJob; the message lists every problem."""


def _field_path(location: tuple[str | int, ...]) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(document)"


def _is_former_ablation(location: tuple[str | int, ...]) -> bool:
    return location[:2] == ("spec", "caramel") and len(location) == 3 and location[2] in FORMER_ABLATION_FIELDS


def describe_validation_error(error: pydantic.ValidationError) -> list[str]:
    """One line per problem: the field's path as written in YAML, what is wrong, and the value given."""
    lines = []
    for problem in error.errors(include_url=False):
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden" and _is_former_ablation(problem["loc"]):
            message = "no longer a CaramelJob field (remove it: Caramel chooses; the benchmarks run this ablation, see benchmarks/README.md)"
        elif problem["type"] == "extra_forbidden":
            message = "unknown field (check its spelling)"
        elif problem["type"] == "string_pattern_mismatch":
            pattern = problem.get("ctx", {}).get("pattern")
            message = f"must be {PATTERN_MEANINGS[pattern]}" if pattern in PATTERN_MEANINGS else message
        given = problem.get("input")
        shown = "" if problem["type"] in {"missing", "extra_forbidden"} or isinstance(given, dict) else f" (got {given!r})"
        lines.append(f"{_field_path(problem['loc'])}: {message}{shown}")
    return lines


def parse_job(document: Any, source: str = "job") -> CaramelJob:
    """Validate one parsed YAML/JSON document as a CaramelJob."""
    if not isinstance(document, dict):
        raise JobFileError(f"{source}: expected a CaramelJob mapping, got {type(document).__name__}")
    try:
        return CaramelJob.model_validate(document)
    except pydantic.ValidationError as error:
        problems = "\n".join(f"  {line}" for line in describe_validation_error(error))
        raise JobFileError(f"{source} is not a valid CaramelJob:\n{problems}") from None


def load_job(path: str | Path) -> CaramelJob:
    """Read the CaramelJob in a YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise JobFileError(f"cannot read job file {path}: {error.strerror}") from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise JobFileError(f"{path} is not valid YAML{where}: {problem}") from None
    if len(documents) != 1:
        raise JobFileError(f"{path}: expected exactly one CaramelJob document, found {len(documents)}")
    return parse_job(documents[0], source=str(path))
