"""Writes the images' pins from pyproject.toml, the one place versions are written (Dockerfile).

    python3 scripts/image_pins.py pyproject.toml OUT_DIR

OUT_DIR/constraints.txt: [project] dependencies, every one pinned with ==, as a pip constraints
file. OUT_DIR/operator.txt: the names of the `operator` extra, the distributions the operator's
image installs beside Caramel's wheel (itself installed without its dependencies, TensorFlow
among them); their versions come from the constraints. Fails, naming it, on an operator
requirement that carries a version of its own or has no pin among the dependencies, so that a
version is never written twice nor left floating. Standard library only: it runs on the base
image's bare python3.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PINNED = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*[^\s;,]+\s*$")
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(pyproject: dict) -> tuple[list[str], list[str]]:
    """The constraints (dependencies) and the operator's requirement names; SystemExit on a problem."""
    project = pyproject["project"]
    dependencies = project["dependencies"]
    pinned: dict[str, str] = {}
    for requirement in dependencies:
        match = PINNED.match(requirement)
        if not match:
            raise SystemExit(f"pyproject.toml: dependency {requirement!r} is not pinned with ==")
        pinned[canonical(match.group(1))] = requirement
    operator = project.get("optional-dependencies", {}).get("operator")
    if not operator:
        raise SystemExit("pyproject.toml: no `operator` extra in [project.optional-dependencies]")
    names = []
    for requirement in operator:
        match = NAME.match(requirement)
        if not match:
            raise SystemExit(
                f"pyproject.toml: the operator extra's {requirement!r} must be a bare name: its version is its pin in dependencies"
            )
        if canonical(match.group(1)) not in pinned:
            raise SystemExit(f"pyproject.toml: the operator extra's {requirement!r} has no == pin in [project] dependencies")
        names.append(match.group(1))
    return dependencies, names


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    source, out = Path(argv[0]), Path(argv[1])
    dependencies, operator = pins(tomllib.loads(source.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "constraints.txt").write_text("".join(f"{line}\n" for line in dependencies))
    (out / "operator.txt").write_text("".join(f"{line}\n" for line in operator))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
