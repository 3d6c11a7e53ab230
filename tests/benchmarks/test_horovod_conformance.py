"""The conformance runner's own parts (benchmarks/horovod_conformance.py): reading each rank's
outcome lines, combining the ranks, and the tables. Running Horovod's tests is the benchmark's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import pytest_outcomes
from benchmarks.horovod_conformance import (
    ENDED_IN_TEST,
    Outcome,
    better_than_horovod,
    by_cause,
    cause_table,
    decided,
    file_table,
    merged,
    parse_args,
    parse_rank,
)

A, B, C = "test_tensorflow.py::T::test_a", "test_tensorflow.py::T::test_b", "test_tensorflow.py::T::test_c"


def lines(*records: dict) -> list[str]:
    return [json.dumps(record) for record in records]


def test_a_rank_s_lines_give_its_ended_tests_and_the_tests_it_started():
    ended, started = parse_rank([
        *lines({"test": A, "event": "start"}, {"test": A, "outcome": "passed", "cause": ""}, {"test": B, "event": "start"}),
        '{"test": "test_tensorflow.py::T::te',  # the rank was killed while writing
    ])  # fmt: skip
    assert ended == {A: Outcome("passed")}
    assert started == [A, B]


def test_a_test_passes_only_if_it_passed_on_every_rank():
    rank0 = parse_rank(lines({"test": A, "event": "start"}, {"test": A, "outcome": "passed"},
                             {"test": B, "event": "start"}, {"test": B, "outcome": "skipped", "cause": "No GPUs available"}))  # fmt: skip
    rank1 = parse_rank(lines({"test": A, "event": "start"}, {"test": A, "outcome": "failed", "cause": "AssertionError: 1 != 2"},
                             {"test": B, "event": "start"}, {"test": B, "outcome": "skipped", "cause": "No GPUs available"}))  # fmt: skip
    assert decided([rank0, rank1], run_ended=True) == {A: Outcome("failed", "AssertionError: 1 != 2"), B: Outcome("skipped", "No GPUs available")}


def test_a_test_a_rank_is_still_in_waits_until_the_run_ends_and_then_fails_there():
    rank0 = parse_rank(lines({"test": A, "event": "start"}, {"test": A, "outcome": "passed"}, {"test": B, "event": "start"}))
    rank1 = parse_rank(lines({"test": A, "event": "start"}, {"test": A, "outcome": "passed"}, {"test": B, "event": "start"},
                             {"test": B, "outcome": "failed", "cause": "ValueError: shapes differ"}))  # fmt: skip
    assert decided([rank0, rank1], run_ended=False) == {A: Outcome("passed")}
    # A rank's own failure says more than the end of its peer's run, whatever the rank order.
    assert decided([rank0, rank1], run_ended=True)[B] == Outcome("failed", "ValueError: shapes differ")
    assert decided([rank0, rank0], run_ended=True)[B] == Outcome("failed", ENDED_IN_TEST)
    # C, which no rank reached, runs again in the next run.
    assert C not in decided([rank0, rank1], run_ended=True)


def test_the_tables_count_per_configuration_group_failures_by_cause_and_name_what_only_horovod_fails():
    horovod = {A: Outcome("failed", "KeyError: 'x'"), B: Outcome("passed"), C: Outcome("skipped", "No GPUs available")}
    caramel = {A: Outcome("passed"), B: Outcome("failed", "KeyError: 'x'"), C: Outcome("failed", "KeyError: 'x'")}
    results = {"caramel-keras3": caramel, "horovod-tf-keras": horovod}
    assert file_table("test_tensorflow.py", results) == [
        "test_tensorflow.py",
        "| configuration | tests | passed | failed | skipped |",
        "| --- | --- | --- | --- | --- |",
        "| caramel-keras3 | 3 | 1 | 2 | 0 |",
        "| horovod-tf-keras | 3 | 1 | 1 | 1 |",
    ]
    assert by_cause(caramel) == {"KeyError: 'x'": ["test_b", "test_c"]}
    assert cause_table("caramel-keras3", "test_tensorflow.py", caramel)[-1] == "| 2 | KeyError: 'x' | test_b, test_c |"
    assert cause_table("horovod-tf-keras", "f.py", {B: Outcome("passed")}) == ["horovod-tf-keras, f.py: no failures"]
    assert better_than_horovod(results) == {"caramel-keras3": ["test_a"]}


def test_the_plugin_says_why_a_test_did_not_pass_in_one_line():
    failed = SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message="tensorflow.errors.FailedPreconditionError: x\nmore")))
    skipped = SimpleNamespace(longrepr=("test.py", 3, "Skipped: No GPUs available"))
    assert pytest_outcomes.cause(failed) == "tensorflow.errors.FailedPreconditionError: x"
    assert pytest_outcomes.cause(skipped) == "No GPUs available"


def test_the_command_line_needs_horovods_tests_and_known_configurations(capsys):
    assert parse_args(["--tests", "t"]).configurations == "caramel-keras3,caramel-tf-keras,horovod-tf-keras"
    for argv in ([], ["--tests", "t", "--configurations", "caramel-mpi"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    assert "unknown configurations" in capsys.readouterr().err


def test_reports_of_several_runs_merge_a_rerun_of_some_tests_into_the_first_run():
    first = {"commit": "a", "command": "run", "files": {"f.py": {"caramel-keras3": {A: {"outcome": "failed", "cause": "x"}, B: {"outcome": "passed", "cause": ""}}}},
             "seconds": {"f.py": {"caramel-keras3": 10.0}}}  # fmt: skip
    rerun = {"commit": "b", "command": "rerun", "files": {"f.py": {"caramel-keras3": {A: {"outcome": "passed", "cause": ""}}}},
             "seconds": {"f.py": {"caramel-keras3": 2.0}}}  # fmt: skip
    document = merged([first, rerun])
    assert document["files"]["f.py"]["caramel-keras3"] == {A: {"outcome": "passed", "cause": ""}, B: {"outcome": "passed", "cause": ""}}
    assert document["seconds"]["f.py"]["caramel-keras3"] == 12.0
    assert document["commit"] == "a, b"
