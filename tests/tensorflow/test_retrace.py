"""A re-plan re-traces the step: the graphs traced for the old plan must be freed, or every
re-plan keeps a whole step graph in memory for the rest of the job (testbed/retrace_worker.py);
and each plan's step is traced once, however many steps its graph holds (testbed/trace_count_worker.py)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import job_manifest, run_caramel, write_manifest

pytestmark = pytest.mark.e2e


def test_step_graphs_traced_through_caramel_are_freed_when_dropped(tmp_path):
    manifest = job_manifest(script=None, command=[sys.executable, "-m", "testbed.retrace_worker"], args=[])
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line.split("| ", 1)[1]) for line in result.stderr.splitlines() if '"alive"' in line]
    assert len(reports) == 2, result.stderr
    assert all(report == {"traced": 3, "alive": 0} for report in reports), reports


def test_each_plan_traces_its_step_once(tmp_path):
    manifest = job_manifest(script=None, command=[sys.executable, "-m", "testbed.trace_count_worker"], args=[], workers={"replicas": 1})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    (report,) = [json.loads(line.split("| ", 1)[1]) for line in result.stderr.splitlines() if "steps_per_traced_graph" in line]
    # The backend's own graph of one step, which runs until the first plan is decided (traced
    # twice: its first trace makes the optimizer's variables), then the first measured plan's
    # step, traced once and copied four times into its execution's graph.
    assert report == {"steps_per_traced_graph": [1, 1, 1]}, result.stderr


def test_a_run_whose_steps_left_do_not_repay_a_graph_of_several_steps_keeps_one_step_per_graph(tmp_path):
    command = [sys.executable, "-m", "testbed.trace_count_worker", "--say-total-steps"]
    manifest = job_manifest(script=None, command=command, args=[], workers={"replicas": 2})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line.split("| ", 1)[1]) for line in result.stderr.splitlines() if "steps_per_traced_graph" in line]
    # Only the own graph of one step (traced twice, see above): no graph of several steps.
    assert reports == [{"steps_per_traced_graph": [1, 1]}] * 2, result.stderr
    # Rank 0 says why, with the figures: the plan found on a busy machine may be the own way itself
    # (no faster), or faster by a few ms a step, which the steps left do not repay.
    why = re.search(r"caramel: keeping one step per graph: (.*)", result.stderr)
    assert why and ("no faster per step" in why[1] or re.search(r"within the \d+ steps left$", why[1])), result.stderr
