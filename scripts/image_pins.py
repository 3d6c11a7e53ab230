"""Writes the images' pins from pyproject.toml, the one place versions are written (Dockerfile).

    python3 scripts/image_pins.py pyproject.toml OUT_DIR

OUT_DIR/constraints.txt: [project] dependencies, every one pinned with ==, as a pip constraints
file. OUT_DIR/operator.txt: the names of the `operator` extra, the distributions the operator's
image installs beside Caramel's wheel (itself installed without its dependencies, TensorFlow
among them); their versions come from the constraints. OUT_DIR/without-dependencies.txt: [tool.caramel]
without-dependencies, pinned with ==, which the runtime image installs with `pip install --no-deps`
(tf-keras). For the GPU image: OUT_DIR/gpu.txt, the dependencies with TensorFlow's CUDA build
(`tensorflow[and-cuda]`) at the CPU build's pin in its place, and [tool.caramel] gpu-runtime;
OUT_DIR/cuda-build.txt, [tool.caramel] cuda-build (Horovod's GPU build). Fails, naming it, on an
operator requirement that carries a version of its own or has
no pin among the dependencies, or on an unpinned requirement, so that a version is never written
twice nor left floating. Standard library only: it runs on the base image's bare python3.
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
        pinned[canonical(pinned_name(requirement, "dependency"))] = requirement
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


def pinned_name(requirement: str, what: str) -> str:
    """The name of a requirement pinned with ==; SystemExit naming it otherwise."""
    match = PINNED.match(requirement)
    if not match:
        raise SystemExit(f"pyproject.toml: {what} {requirement!r} is not pinned with ==")
    return match.group(1)


def without_dependencies(pyproject: dict) -> list[str]:
    """What the runtime installs without its dependencies ([tool.caramel] without-dependencies)."""
    return _tool_pins(pyproject, "without-dependencies")


TENSORFLOW_CPU = "tensorflow-cpu"


def gpu_requirements(pyproject: dict) -> list[str]:
    """The GPU image's requirements: the dependencies, TensorFlow's CPU build replaced by its CUDA
    build of the same version, and the GPU runtime's own pins."""
    requirements = []
    for requirement in pyproject["project"]["dependencies"]:
        name = pinned_name(requirement, "dependency")
        requirements.append(f"tensorflow[and-cuda]{requirement[len(name):]}" if canonical(name) == TENSORFLOW_CPU else requirement)
    if requirements == pyproject["project"]["dependencies"]:
        raise SystemExit(f"pyproject.toml: no {TENSORFLOW_CPU} among the dependencies, for the GPU image to replace")
    return requirements + _tool_pins(pyproject, "gpu-runtime")


def _tool_pins(pyproject: dict, key: str) -> list[str]:
    """[tool.caramel] `key`, every entry pinned with ==."""
    requirements = pyproject.get("tool", {}).get("caramel", {}).get(key, [])
    for requirement in requirements:
        pinned_name(requirement, f"[tool.caramel] {key} entry")
    return requirements


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    source, out = Path(argv[0]), Path(argv[1])
    pyproject = tomllib.loads(source.read_text())
    dependencies, operator = pins(pyproject)
    out.mkdir(parents=True, exist_ok=True)
    (out / "constraints.txt").write_text("".join(f"{line}\n" for line in dependencies))
    (out / "operator.txt").write_text("".join(f"{line}\n" for line in operator))
    (out / "without-dependencies.txt").write_text("".join(f"{line}\n" for line in without_dependencies(pyproject)))
    (out / "gpu.txt").write_text("".join(f"{line}\n" for line in gpu_requirements(pyproject)))
    (out / "cuda-build.txt").write_text("".join(f"{line}\n" for line in _tool_pins(pyproject, "cuda-build")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
