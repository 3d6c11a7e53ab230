"""Failure summaries (caramel.contract.termination): the first error line, and a head with the last lines
that fit a size."""

from __future__ import annotations

import pytest

from caramel.contract.termination import GAP, first_error_line, fit, is_error_line

PYTHON_TRACEBACK = [
    "rank 1 | Traceback (most recent call last):",
    'rank 1 |   File "/usr/lib/python3.11/site-packages/kopf/_cogs/clients/errors.py", line 3, in check',
    "rank 1 |     raise ValueError(shard)",
    "rank 1 | ValueError: bad shard 7",
]
GLOO_ABORT = [
    "rank 0 | terminate called after throwing an instance of 'gloo::IoException'",
    "rank 0 |   what():  [horovod/common/gloo/http_store.cc:54] Wait timeout after 30 seconds for key(s): 1.",
    "rank 0 | See exception message above",
]


@pytest.mark.parametrize(
    ("lines", "cause"),
    [
        (PYTHON_TRACEBACK, "rank 1 | ValueError: bad shard 7"),
        (GLOO_ABORT, f"{GLOO_ABORT[0]} {GLOO_ABORT[1].strip()}"),
        (["step 3", "worker 1 | rank 1 killed by SIGKILL; stopping the other ranks"], "worker 1 | rank 1 killed by SIGKILL; stopping the other ranks"),
        (["RuntimeError: first", "OSError: second"], "RuntimeError: first"),
        (["step 1", "step 2"], ""),
        ([], ""),
    ],
    ids=["traceback", "gloo-abort", "killed", "first-of-two", "none", "empty"],
)
def test_the_first_error_line_is_the_cause(lines, cause):
    assert first_error_line(lines) == cause


def test_names_of_variables_and_source_paths_are_no_errors():
    assert not is_error_line("rank 0 | HOROVOD_GLOO_TIMEOUT_SECONDS=600")
    assert not is_error_line('rank 0 |   File "/app/errors.py", line 1, in <module>')
    assert is_error_line("rank 0 | Wait timeout after 30 seconds")


def test_fit_keeps_the_head_and_the_last_lines_within_the_limit():
    lines = [f"line {i:03d}" for i in range(100)]
    text = fit(["headline", "cause"], lines, 100)
    assert len(text.encode()) <= 100
    kept = text.splitlines()
    assert kept[:3] == ["headline", "cause", GAP]
    assert kept[-1] == "line 099" and kept[3:] == lines[-len(kept) + 3 :]


def test_fit_keeps_everything_that_fits_without_a_gap_and_no_line_twice():
    assert fit(["headline", "cause"], ["a", "cause", "b"], 1000) == "headline\ncause\na\nb"
    assert fit(["headline", ""], ["a"], 1000) == "headline\na"


def test_fit_cuts_a_head_larger_than_the_limit():
    assert fit(["é" * 100], ["tail"], 11) == "é" * 5
