"""The layers between Caramel's packages and the product's types, as CI checks them: import-linter's
contracts and mypy, both configured in pyproject.toml ([tool.importlinter], [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    # From the repository root: the configuration is its pyproject.toml, and `benchmarks` and
    # `testbed`, which the contracts name, import from there.
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_packages_keep_their_layers():
    # The console script beside this interpreter: import-linter has no `python -m` entry point.
    result = _run([str(Path(sys.executable).with_name("lint-imports"))])
    if result.returncode:
        pytest.fail(result.stdout + result.stderr, pytrace=False)


def test_the_product_benchmark_and_testbed_packages_type_check():
    result = _run([sys.executable, "-m", "mypy"])
    if result.returncode:
        pytest.fail(result.stdout + result.stderr, pytrace=False)
