"""Failure summaries (caramel.contract.termination): the first error line, a head with the last lines
that fit a size, and whether the script raised (not a peer's failure)."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime

from caramel.contract.termination import (
    GAP,
    RankOutput,
    ScriptRaised,
    failure_cause,
    failure_message,
    failure_time,
    first_error_line,
    fit,
    is_error_line,
    raised_by_the_script,
    script_raised,
)

PYTHON_TRACEBACK = [
    "rank 1 | Traceback (most recent call last):",
    'rank 1 |   File "/usr/lib/python3.11/site-packages/kopf/_cogs/clients/errors.py", line 3, in check',
    "rank 1 |     raise ValueError(shard)",
    "rank 1 | ValueError: bad shard 7",
]
NOT_SERVED = [
    "rank 0 | Traceback (most recent call last):",
    'rank 0 |   File "/app/train.py", line 9, in <module>',
    "rank 0 | caramel.tensorflow.unsupported.NotSupportedByCaramel: hvd.join() is not supported by Caramel: let every rank run the same steps",
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
        (NOT_SERVED, NOT_SERVED[-1]),
        (["step 3", "worker 1 | rank 1 killed by SIGKILL; stopping the other ranks"], "worker 1 | rank 1 killed by SIGKILL; stopping the other ranks"),
        (["RuntimeError: first", "OSError: second"], "RuntimeError: first"),
        (["step 1", "step 2"], ""),
        ([], ""),
    ],
    ids=["traceback", "gloo-abort", "not-served", "killed", "first-of-two", "none", "empty"],
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


@pytest.mark.parametrize(
    ("returncode", "traceback_seen", "first_error", "raised"),
    [
        (1, True, "rank 1 | ValueError: bad learning rate", True),
        (1, True, NOT_SERVED[-1], True),
        (1, False, "rank 1 | ValueError: bad learning rate", False),  # sys.exit(1) after printing it: the script's choice
        (-9, True, "rank 1 | ValueError: bad learning rate", False),  # killed
        (3, True, "rank 1 | ValueError: bad learning rate", False),
        (1, True, "", False),
        (1, True, "rank 0 | ConnectionResetError: [Errno 104] Connection reset by peer", False),
        (1, True, "rank 0 | RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.7]:4242", False),
        (1, True, "rank 0 | horovod.common.exceptions.HorovodInternalError: ncclAllReduce failed", False),
        (1, True, "rank 0 | caramel.collectives.tree_transport.TransportError: all-reduce 3 on rank 0 failed: EOF", False),
        (1, True, "rank 0 | tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: ...", False),
        (1, True, "rank 0 | TimeoutError: the rendezvous at 10.0.0.1:29400 did not answer", False),
        (1, True, "rank 0 | tensorflow.python.framework.errors_impl.AbortedError: [_Derived_]Collective ops is aborted", False),
        (1, True, "rank 0 | tensorflow.python.framework.errors_impl.CancelledError: [_Derived_]Cancelled", False),
    ],
    ids=["value-error", "not-served", "no-traceback", "killed", "other-status", "no-error-line", "reset", "gloo-closed",
         "horovod-internal", "transport", "unavailable", "timeout", "aborted", "cancelled"],
)  # fmt: skip
def test_a_script_raised_where_python_ended_on_its_own_exception_not_on_a_peers_failure(returncode, traceback_seen, first_error, raised):
    assert raised_by_the_script(returncode, traceback_seen, first_error) is raised


# TensorFlow's log on a machine without a GPU, in the GPU image: an error line that stops nothing.
NO_GPU_LOG = "E0000 00:00:1733440000.000000 cuda_executor.cc:1228] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
NO_GPU = f"rank 0 | {NO_GPU_LOG}"
PEER_RESET = [
    "rank 0 | Traceback (most recent call last):",
    'rank 0 |   File "/app/train.py", line 30, in <module>',
    "rank 0 | ConnectionResetError: [Errno 104] Connection reset by peer",
]


@pytest.mark.parametrize(
    ("lines", "causes", "raised"),
    [
        (PYTHON_TRACEBACK, [PYTHON_TRACEBACK[-1]], True),
        ([NO_GPU, *PYTHON_TRACEBACK], [PYTHON_TRACEBACK[-1], NO_GPU], True),
        ([NO_GPU, *PEER_RESET], [PEER_RESET[-1], NO_GPU], False),
        ([*PEER_RESET[:2], "rank 0 | ValueError: bad shard 7"], ["rank 0 | ValueError: bad shard 7"], True),
        # Python's chained exceptions: the rank ended on the last traceback's.
        ([*PYTHON_TRACEBACK, "rank 1 | During handling of the above exception, another exception occurred:", *PEER_RESET],
         [PEER_RESET[-1], PYTHON_TRACEBACK[-1]], False),
        (GLOO_ABORT, [f"{GLOO_ABORT[0]} {GLOO_ABORT[1].strip()}"], False),
        (["rank 0 | step 1"], [], False),
    ],
    ids=["traceback", "no-gpu-then-script", "no-gpu-then-peer", "traceback-only", "chained", "no-traceback", "no-error"],
)  # fmt: skip
def test_a_ranks_output_says_the_exception_it_ended_on_then_its_first_error(lines, causes, raised):
    output = RankOutput()
    for line in lines:
        output.add(line)
    assert output.causes == causes
    assert output.raised_by_the_script(1) is raised
    message = failure_message("rank 0 exited with code 1", datetime.now(UTC), output.causes, lines)
    assert failure_cause(message) == (causes[0] if causes else "")


@pytest.mark.parametrize("said", [ScriptRaised(before_first_step=True), ScriptRaised(before_first_step=False), None])
def test_a_failure_summary_says_whether_the_script_raised_and_keeps_the_error_as_its_cause(said):
    moment = datetime(2026, 12, 2, 1, 0, 0, 123456, tzinfo=UTC)
    message = failure_message("rank 1 exited with code 1", moment, ["rank 1 | ValueError: bad learning rate"], ["rank 1 | last"], said)
    assert script_raised(message) == said
    assert failure_cause(message) == "rank 1 | ValueError: bad learning rate"  # the line that says so reads as no error
    assert failure_time(message) == moment


def test_a_log_tail_or_a_killed_workers_summary_says_no_script_raised():
    assert script_raised("rank 1 | raised by the script\nValueError: x") is None  # a log line saying so is no summary's
    assert script_raised(failure_message("rank 1 killed by SIGKILL", datetime.now(UTC), [], [])) is None
