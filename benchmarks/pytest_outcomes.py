"""A pytest plugin that writes each test's outcome on this rank as it ends, one JSON line each, to
`$CONFORMANCE_OUTCOMES/rank<HOROVOD_RANK>.jsonl` (appended): what `horovod_conformance` reads.

    python -m pytest -p benchmarks.pytest_outcomes FILE...

Written as the tests run, not at the end (as junit xml is), because a rank whose test hangs is
killed by pytest-timeout (its thread method ends the process): the lines of the tests before it
stay, and the test it was in is the last one started without an outcome. The plugin imports
nothing but the standard library, so that it runs under real Horovod as under Caramel.
"""

from __future__ import annotations

import json
import os
from typing import Any

OUTCOMES_VARIABLE = "CONFORMANCE_OUTCOMES"


def _write(record: dict[str, Any]) -> None:
    directory = os.environ.get(OUTCOMES_VARIABLE)
    if directory:
        with open(os.path.join(directory, f"rank{os.environ.get('HOROVOD_RANK', '0')}.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\n")


def cause(report: Any) -> str:
    """The first line of what ended a test that did not pass: the exception (`Type: message`) or
    the reason it was skipped."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
    return (text.strip().splitlines() or [""])[0]


_worst: dict[str, tuple[str, str]] = {}
"""The running test's outcome and cause, once a phase of it (setup, call, teardown) did not pass."""


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"test": nodeid, "event": "start"})


def pytest_runtest_logreport(report: Any) -> None:
    if report.outcome != "passed":  # the first phase that did not pass says why
        _worst.setdefault(report.nodeid, (report.outcome, cause(report)))
    if report.when == "teardown":
        outcome, why = _worst.pop(report.nodeid, ("passed", ""))
        _write({"test": report.nodeid, "outcome": outcome, "cause": why})
