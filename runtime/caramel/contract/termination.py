"""A worker's last words: its pod's termination message, which the operator reads.

The worker entrypoint writes it to the file CARAMEL_TERMINATION_MESSAGE_PATH names (the kubelet
keeps at most TERMINATION_MESSAGE_BYTES of it):
- a worker that succeeded leaves rank 0's last progress report (`caramel.contract.progress`),
  from which the operator records the step the job ended at (`final_report`);
- a worker whose rank failed leaves a failure summary: which rank, when it failed, whether the
  script raised (`ScriptRaised`), the exception its rank ended on and the first line of its
  output that reads as an error (`RankOutput`), and its last lines (`failure_message`).

Why a summary: the last lines alone rarely say why. Gloo's abort ends with "See exception
message above", a failed rank's peers end with their own follow-on errors, and a Python
traceback's first lines are cut off. The exception the rank ended on (or, where it ended on
none, its first error line) is the cause far more often. The operator keeps the message whole
in the job's status, finds the cause in it (`failure_cause`, or in the kubelet's tail of the
log, where the worker wrote nothing), and puts the cause and the last lines into the Event of
each restart (`fit`), so that a failed gang's logs outlive its deleted pods.

Why the moment: when one worker fails its peers follow within milliseconds (a connection reset,
a collective aborted), and the operator blames the one that failed first. The kubelet's
`finishedAt` is to the second, and comes after the worker stopped its other ranks; the worker's
own record of when its rank ended (`failure_time`) is to the microsecond.

Why whether the script raised: a script's own bug (a ValueError on a wrong argument, a feature
Caramel does not serve) raises again at every restart, and the restart policy fails such a job at
once (`caramel.contract.restart`). Only the worker can tell: its rank's process ended as Python
ends on an exception (status 1 after a traceback), not killed, not stopped, and with neither that
exception nor its first error a peer's failure (a rank whose peer died raises too, of a
connection reset or a collective aborted: that is not its script's bug). And only rank 0's
worker can tell whether a step was done: rank 0 alone reports progress, and a step is done by all
ranks together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from caramel.contract.progress import ProgressReport, format_report, parse_report

TERMINATION_MESSAGE_PATH_VARIABLE = "CARAMEL_TERMINATION_MESSAGE_PATH"
"""The environment variable naming the file a worker writes its termination message to."""
TERMINATION_MESSAGE_BYTES = 4096
"""The most of a termination message the kubelet keeps."""

# What an error line says: an exception or error with its message ("ValueError: ...", not the
# source line "raise ValueError(x)"), Caramel's refusal of what it does not serve (whose name says
# neither), a C++ abort, a timeout, a kill.
_ERROR = re.compile(
    r"\w*(error|exception)(:|$)|NotSupportedByCaramel:|what\(\):|terminate called|\babort|\bfatal\b|\btimed? ?out\b|\bkilled\b",
    re.IGNORECASE,
)
# A traceback's source lines name files such as errors.py: they are where, not why.
_TRACEBACK_SOURCE = re.compile(r'^\s*File "')
# What a rank raises when a peer died or could not be reached: not its own script's bug.
_PEER_ERROR = re.compile(
    r"connection|\bpeer\b|broken pipe|\btimed? ?out\b|timeout|deadline|\babort|\bcancel|\bclosed\b|unavailable|rendezvous|EOFError"
    r"|HorovodInternalError|HostsUpdatedInterrupt|TransportError",
    re.IGNORECASE,
)
# The line Python writes before an uncaught exception, and the status it then exits with.
TRACEBACK = "Traceback (most recent call last):"
PYTHON_EXCEPTION_STATUS = 1
# The line of a failure summary that says the script raised, and that rank 0 had done no step.
# Worded so as not to read as an error line: the cause is the script's own line.
SCRIPT_RAISED = "raised by the script"
BEFORE_FIRST_STEP = ", before rank 0's first step"
# Marks the lines left out between the head and the last lines.
GAP = "..."
# The line of a failure summary that says when the rank failed, before its time in UTC.
FAILED_AT = "failed at "
FAILED_AT_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def is_error_line(line: str) -> bool:
    text = line.split(" | ", 1)[-1]  # after a worker's "rank N | " prefix
    return bool(_ERROR.search(text)) and not _TRACEBACK_SOURCE.match(text)


def is_peer_error(line: str) -> bool:
    """Whether an error line says a peer failed or could not be reached (a connection reset, a
    collective aborted, a timeout), rather than what the rank's own script did wrong."""
    return bool(_PEER_ERROR.search(line.split(" | ", 1)[-1]))


def raised_by_the_script(returncode: int, traceback_seen: bool, *errors: str) -> bool:
    """Whether a rank's training process ended as Python ends on an exception of its script's own:
    status 1 after a traceback (not a signal, not sys.exit), none of its `errors` (its first error
    line, the exception its traceback ended on) a peer's failure."""
    said = [error for error in errors if error]
    return returncode == PYTHON_EXCEPTION_STATUS and traceback_seen and bool(said) and not any(map(is_peer_error, said))


@dataclass(frozen=True)
class ScriptRaised:
    """What a failure summary says of a rank whose script raised (`raised_by_the_script`)."""

    before_first_step: bool
    """Rank 0 had reported no step: said only by rank 0's worker, the one that knows."""

    @property
    def line(self) -> str:
        return SCRIPT_RAISED + (BEFORE_FIRST_STEP if self.before_first_step else "")


def first_error_line(lines: Sequence[str]) -> str:
    """The first line that reads as an error, with the next one where that is a C++ exception's
    `what():` (the line that says what went wrong); empty when no line does."""
    for index, line in enumerate(lines):
        if is_error_line(line):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if "what():" in following and "what():" not in line:
                return f"{line.strip()} {following.strip()}"
            return line.strip()
    return ""


class RankOutput:
    """What a failure summary needs of one rank's output, read a line at a time: its first error
    line, the error its last traceback ended on (the exception Python raised), and whether it wrote
    a traceback at all. The two errors differ where a library logged an error that did not stop the
    rank: TensorFlow's "failed call to cuInit" on a machine without a GPU comes first, and the
    exception that ended the rank, a peer's connection reset say, only after it."""

    def __init__(self) -> None:
        self.traceback_seen = False
        self._first_error: list[str] = []
        self._since_traceback: list[str] = []

    def add(self, line: str) -> None:
        if TRACEBACK in line:
            self.traceback_seen = True
            self._since_traceback = []
            return
        self._keep(self._first_error, line)
        if self.traceback_seen:
            self._keep(self._since_traceback, line)

    @staticmethod
    def _keep(kept: list[str], line: str) -> None:
        """Keep the first error line and the line after it (a C++ exception's what())."""
        if (not kept and is_error_line(line)) or len(kept) == 1:
            kept.append(line)

    @property
    def causes(self) -> list[str]:
        """The exception the rank ended on, then its first error line where that is another."""
        said = [first_error_line(self._since_traceback), first_error_line(self._first_error)]
        return list(dict.fromkeys(line for line in said if line))

    def raised_by_the_script(self, returncode: int) -> bool:
        return raised_by_the_script(returncode, self.traceback_seen, *self.causes)


def fit(head: Sequence[str], lines: Sequence[str], limit_bytes: int) -> str:
    """The `head` lines whole (cut only if they alone exceed the limit), then as many of the last
    `lines` as fit within `limit_bytes` (UTF-8), with a "..." line where lines were left out.
    Lines already in the head are not repeated."""
    kept_head = [line for line in head if line]
    text = "\n".join(kept_head)
    if len(text.encode()) >= limit_bytes:
        return text.encode()[:limit_bytes].decode(errors="ignore")
    rest = [line for line in lines if line not in kept_head]
    budget = limit_bytes - len(text.encode())
    tail: list[str] = []
    for line in reversed(rest):
        cost = len(line.encode()) + 1
        # Room for the gap marker too, unless every line fits.
        reserve = 0 if len(tail) + 1 == len(rest) else len(GAP) + 1
        if cost + reserve > budget:
            break
        tail.insert(0, line)
        budget -= cost
    gap = [GAP] if len(tail) < len(rest) else []
    return "\n".join([*kept_head, *gap, *tail])


def success_message(report: ProgressReport) -> str:
    """The termination message of a worker that succeeded: rank 0's last progress report."""
    return format_report(report)


def failure_message(
    headline: str, failed_at: datetime, causes: Sequence[str], last_lines: Sequence[str], raised: ScriptRaised | None = None
) -> str:
    """The termination message of a worker whose rank failed: `headline` (which rank, how it
    ended), when (`failed_at`, UTC), whether its script raised (`raised`, where it did), the lines
    that say why (`causes`: `RankOutput.causes`), and as many of its last lines as fit."""
    when = FAILED_AT + failed_at.astimezone(UTC).strftime(FAILED_AT_FORMAT)
    return fit([headline, when, raised.line if raised else "", *causes], last_lines, TERMINATION_MESSAGE_BYTES)


def failure_time(message: str) -> datetime | None:
    """When the failed rank ended, from its worker's failure summary; None where it says not."""
    for line in message.splitlines()[:2]:
        if line.startswith(FAILED_AT):
            try:
                return datetime.strptime(line.removeprefix(FAILED_AT), FAILED_AT_FORMAT).replace(tzinfo=UTC)
            except ValueError:
                return None
    return None


def script_raised(message: str) -> ScriptRaised | None:
    """What a failed worker's summary says of its script having raised; None where it says not
    (the worker's rank failed otherwise, or the message is no summary: the kubelet's tail of a log)."""
    for line in message.splitlines()[:3]:
        if line == SCRIPT_RAISED or line == SCRIPT_RAISED + BEFORE_FIRST_STEP:
            return ScriptRaised(before_first_step=line.endswith(BEFORE_FIRST_STEP))
    return None


def final_report(message: str) -> ProgressReport | None:
    """The progress report a successful worker left, or None where its message holds none."""
    return parse_report(message.strip())


def failure_cause(message: str) -> str:
    """The first line of a failed worker's message that reads as an error (empty when none does)."""
    return first_error_line(message.splitlines())
