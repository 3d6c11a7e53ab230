"""Writes the chart's README (helm/caramel/README.md) from its values schema and its values.

    python helm/chart_readme.py            # rewrite the README
    python helm/chart_readme.py --check    # exit 1 if the committed README differs

Each value's description, allowed values and type come from values.schema.json, which `helm`
checks values against; its default comes from values.yaml. tests/deploy/test_chart.py fails when the
committed README drifts from them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "caramel"
README = CHART / "README.md"

INTRODUCTION = """\
The Caramel operator runs CaramelJobs (data-parallel TensorFlow training with Horovod) on
Kubernetes; this chart installs it, with the CaramelJob CRD, its RBAC, roles for the users of
CaramelJobs, the Service of its metrics and, optionally, prometheus-operator monitors and a
Grafana dashboard. The repository's docs/operator.md says how the operator runs jobs.

```sh
helm install caramel helm/caramel -n caramel-system --create-namespace
```

Two images, both built by the repository's `scripts/build-image.sh` and both to be pullable by the
cluster's nodes: the operator runs in `caramel-operator` (value `image`), which holds no
TensorFlow; the workers of jobs that set no `spec.image` run in `caramel-runtime` (value
`runtimeImage`), with TensorFlow, Keras and Horovod.
"""


def render(schema: dict[str, Any], values: dict[str, Any], chart: dict[str, Any]) -> str:
    rows = list(_rows(schema, schema, values, ""))
    table = "\n".join(f"| `{key}` | {default} | {description} |" for key, default, description in rows)
    return (
        f"# The {chart['name']} chart {chart['version']}\n\n{INTRODUCTION}\n"
        f"Kubernetes {chart['kubeVersion']}.\n\n## Values\n\n"
        "Generated from values.schema.json and values.yaml by `python helm/chart_readme.py`; do not edit.\n\n"
        f"| Key | Default | Description |\n| --- | --- | --- |\n{table}\n"
    )


def _rows(node: dict[str, Any], schema: dict[str, Any], values: Any, prefix: str):
    for name, child in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        if "description" not in child:
            raise SystemExit(f"values.schema.json: {key} has no description")
        default = values.get(name) if isinstance(values, dict) else None
        shown = "" if "properties" in child else f"`{json.dumps(default)}`" if name in (values or {}) else ""
        yield key, shown, _describe(child, schema)
        if "properties" in child:
            yield from _rows(child, schema, default or {}, f"{key}.")


def _describe(node: dict[str, Any], schema: dict[str, Any]) -> str:
    parts = [node["description"]]
    target = _resolve(node, schema)
    choices = node.get("enum") or target.get("enum")
    if choices:
        parts.append("One of " + ", ".join(f"`{choice}`" for choice in choices) + ".")
    if target is not node and target.get("description"):
        parts.append(target["description"])
    return " ".join(parts).replace("|", "\\|")


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    reference = node.get("$ref") or next((option["$ref"] for option in node.get("anyOf", []) if "$ref" in option), None)
    return schema["definitions"][reference.rsplit("/", 1)[-1]] if reference else node


def generate() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return render(schema, values, chart)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed README differs")
    text = generate()
    if parser.parse_args().check:
        if README.read_text() != text:
            print(f"{README} is out of date: run `python helm/chart_readme.py`", file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
