"""testbed.consecutive_runs: a job run many times in a row, stopping at the first run that fails,
whose last lines it shows and whose whole output it keeps. Jobs of a trivial command stand in for
training (no TensorFlow)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from conftest import job_manifest, write_manifest
from testbed.consecutive_runs import main

COUNTING = """
import pathlib, sys
counter = pathlib.Path(sys.argv[1])
runs = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(runs))
print(f"run number {runs}", flush=True)
sys.exit(3 if runs == int(sys.argv[2]) else 0)
"""


def runs_of(tmp_path: Path, fail_at: int, runs: int) -> tuple[int, list[str]]:
    manifest = job_manifest(script=None, command=[sys.executable, "-c", COUNTING, str(tmp_path / "count"), str(fail_at)], args=[],
                            workers={"replicas": 1}, runPolicy={"backoffLimit": 0})  # fmt: skip
    lines: list[str] = []
    code = main([str(write_manifest(tmp_path, manifest)), "--workers", "1", "--runs", str(runs)], say=lines.append)
    return code, lines


def test_every_run_succeeding_is_reported_as_such(tmp_path):
    code, lines = runs_of(tmp_path, fail_at=0, runs=2)
    assert code == 0
    assert [line.split(" in ")[0] for line in lines[1:3]] == ["run 1/2: Succeeded", "run 2/2: Succeeded"]
    assert lines[-1] == "all 2 runs succeeded"


def test_the_first_failing_run_stops_the_series_and_shows_why(tmp_path):
    code, lines = runs_of(tmp_path, fail_at=2, runs=5)
    assert code == 1
    assert lines[2].startswith("run 2/5: FAILED in ")
    assert any("rank 0 | run number 2" in line for line in lines)
    assert lines[-1] == "1 of 5 runs succeeded before run 2 failed"
    log = Path(re.search(r"all of them in (\S+)\)", "\n".join(lines)).group(1))
    assert "run number 2" in log.read_text()
    log.unlink()
