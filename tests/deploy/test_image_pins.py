"""What the two images install, checked without docker (tests/deploy/test_docker_e2e.py builds them).

The operator's image installs Caramel's wheel without its dependencies and, beside it, the
`operator` extra of pyproject.toml at the pins of the dependencies (scripts/image_pins.py writes
both lists); the workers' image installs the dependencies. The operator must not import
TensorFlow, which its image does not hold.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from conftest import REPO

PYPROJECT = REPO / "pyproject.toml"
NOT_IN_THE_OPERATOR = ("tensorflow", "tensorflow-cpu", "keras", "tf-keras", "horovod")


def image_pins() -> Any:
    spec = importlib.util.spec_from_file_location("image_pins", REPO / "scripts" / "image_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_images_pins_come_from_pyproject(tmp_path) -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "image_pins.py"), str(PYPROJECT), str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert (tmp_path / "constraints.txt").read_text().splitlines() == project["dependencies"]
    operator = (tmp_path / "operator.txt").read_text().splitlines()
    assert operator == project["optional-dependencies"]["operator"]
    pinned = {image_pins().canonical(line.split("==")[0]) for line in project["dependencies"]}
    assert {image_pins().canonical(name) for name in operator} <= pinned
    assert not {image_pins().canonical(name) for name in operator} & set(NOT_IN_THE_OPERATOR)
    without = (tmp_path / "without-dependencies.txt").read_text().splitlines()
    assert without == tomllib.loads(PYPROJECT.read_text())["tool"]["caramel"]["without-dependencies"] == ["tf-keras==2.21.0"]
    # The GPU image: the same dependencies but TensorFlow's CUDA build at the same pin, and NCCL pinned.
    gpu = (tmp_path / "gpu.txt").read_text().splitlines()
    assert [line for line in gpu if line.startswith("tensorflow")] == ["tensorflow[and-cuda]==2.21.0"]
    assert set(gpu) - set(project["dependencies"]) == {"tensorflow[and-cuda]==2.21.0", "nvidia-nccl-cu12==2.27.7"}
    assert set(project["dependencies"]) - set(gpu) == {"tensorflow-cpu==2.21.0"}
    assert [line.split("==")[0] for line in (tmp_path / "cuda-build.txt").read_text().splitlines()] == [
        "nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12"
    ]


def test_the_gpu_image_needs_tensorflows_cpu_pin_to_replace_and_pinned_gpu_packages() -> None:
    with pytest.raises(SystemExit, match="no tensorflow-cpu among the dependencies"):
        image_pins().gpu_requirements({"project": {"dependencies": ["keras==3.15.1"]}})
    with pytest.raises(SystemExit, match="gpu-runtime entry 'nvidia-nccl-cu12' is not pinned with =="):
        image_pins().gpu_requirements({"project": {"dependencies": ["tensorflow-cpu==2.21.0"]}, "tool": {"caramel": {"gpu-runtime": ["nvidia-nccl-cu12"]}}})


def test_what_the_runtime_installs_without_dependencies_must_be_pinned() -> None:
    with pytest.raises(SystemExit, match="without-dependencies entry 'tf-keras' is not pinned with =="):
        image_pins().without_dependencies({"tool": {"caramel": {"without-dependencies": ["tf-keras"]}}})


@pytest.mark.parametrize(
    ("operator", "refusal"),
    [
        (["kopf==1.45.2"], "must be a bare name"),
        (["kopf", "rich"], "'rich' has no == pin"),
        ([], "no `operator` extra"),
    ],
    ids=["versioned", "unpinned", "missing"],
)
def test_operator_requirements_are_names_pinned_among_the_dependencies(operator: list[str], refusal: str) -> None:
    pyproject = {"project": {"dependencies": ["kopf==1.45.2", "tensorflow-cpu==2.21.0"],
                             "optional-dependencies": {"operator": operator}}}
    with pytest.raises(SystemExit, match=refusal):
        image_pins().pins(pyproject)


def test_dependencies_must_be_pinned() -> None:
    pyproject = {"project": {"dependencies": ["kopf>=1.45"], "optional-dependencies": {"operator": ["kopf"]}}}
    with pytest.raises(SystemExit, match="is not pinned with =="):
        image_pins().pins(pyproject)


def test_the_operator_imports_no_tensorflow() -> None:
    """Its entry point and its handlers, in a fresh interpreter (the operator's image checks the
    same where TensorFlow is not even installed)."""
    code = "import json, sys, caramel_operator.__main__, caramel_operator.handlers; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = {name.split(".")[0] for name in json.loads(result.stdout)}
    assert not imported & {"tensorflow", "keras", "horovod", "tf_keras"}, sorted(imported)
