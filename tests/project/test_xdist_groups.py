"""`make test` runs on pytest-xdist with `--dist loadgroup`, and tests that share a module's run of a
job (tests/benchmarks/test_emulated_worker.py) are an `xdist_group`, so that one worker runs them and the job
once. A pytest and xdist pair that stops grouping says nothing: the tests still pass, and the job
runs again on the other worker (pytest 9.2 with xdist 3.8 did, pytest-dev/pytest-xdist#1386; the
pin in pyproject.toml says so). This runs the installed pair as `make test` does."""

from __future__ import annotations

import re
import subprocess
import sys

GROUPED = """
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("case", range(4))
def test_grouped(case):
    pass

@pytest.mark.parametrize("case", range(4))
def test_alone(case):
    pass
"""


def test_loadgroup_runs_a_groups_tests_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cloudcoil", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v", "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers = re.findall(r"\[(gw\d+)\] .*PASSED test_grouped\.py::test_grouped\[\d\]@shared", result.stdout)
    assert len(workers) == 4 and len(set(workers)) == 1, result.stdout[-3000:]
