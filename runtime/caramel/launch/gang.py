"""A gang of processes started together, watched together and stopped together.

`caramel run` runs its workers as one (`launcher`), every worker its training processes
(`entrypoint`), and the benchmarks their workers in emulated network namespaces
(`benchmarks.jobrun`): each gives `run_gang` the way it starts a member. The members' output
lines are relayed on the caller's thread, in the order they come. The gang ends when every
member has exited 0, when one fails (its peers could only wait for it), or when the caller stops
it; whatever happens, no member is left running when `run_gang` returns or raises.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from caramel.launch.processes import pump_lines, stop_groups

Member = subprocess.Popen[bytes]


class CannotStart(Exception):
    """A member could not be started (the OSError is the cause); the members started before it
    have been stopped."""

    def __init__(self, member: int, error: OSError) -> None:
        super().__init__(f"member {member}: {error}")
        self.member = member
        self.error = error


@dataclass(frozen=True)
class GangEnd:
    """How a gang ended."""

    failed: int | None = None
    """The member that failed (exited other than 0) first, where one did."""
    returncode: int | None = None
    """Its return code (negative: the signal that killed it)."""
    stopped: str = ""
    """Why the caller stopped the gang while members still ran (`stop_reason`'s answer), where it did."""
    still_running: tuple[int, ...] = ()
    """The members that were still running when the caller stopped the gang."""

    @property
    def succeeded(self) -> bool:
        return self.failed is None and not self.stopped


def run_gang(
    size: int,
    spawn: Callable[[int], Member],
    on_line: Callable[[int, str], None],
    *,
    stop_reason: Callable[[], str | None] = lambda: None,
    on_failure: Callable[[int, int], None] = lambda member, returncode: None,
    stop: Callable[[Sequence[Member]], None] = stop_groups,
    poll_seconds: float = 0.2,
) -> GangEnd:
    """Start members 0 to size - 1 with `spawn(member)` (a process whose stdout is a pipe, in its
    own process group), and run them until they end.

    Every line a member writes goes to `on_line(member, line)`. Every `poll_seconds` the members
    are looked at: the first that failed ends the gang (`on_failure(member, returncode)` is told
    at once, before its peers are stopped); then `stop_reason()` may end it (a signal, a
    deadline). Before returning or raising, `stop` is given the members still running, or not
    yet reaped (`stop_groups` by default: SIGTERM to their groups, SIGKILL after a grace period),
    and their last lines are relayed. A member that cannot be started raises CannotStart.
    """
    lines: queue.Queue[tuple[int, str]] = queue.Queue()
    members: list[Member] = []
    pumps: list[threading.Thread] = []
    end = GangEnd()
    try:
        for index in range(size):
            try:
                member = spawn(index)
            except OSError as error:
                raise CannotStart(index, error) from error
            members.append(member)
            assert member.stdout is not None, "a member's stdout must be a pipe"
            pumps.append(pump_lines(member.stdout, partial(_queue_line, lines, index)))
        running = set(range(size))
        while running:
            _relay(lines, on_line, poll_seconds)
            for index in sorted(running):
                returncode = members[index].poll()
                if returncode is None:
                    continue
                running.discard(index)
                if returncode != 0:
                    end = GangEnd(failed=index, returncode=returncode)
                    on_failure(index, returncode)
                    running.clear()
                    break
            reason = stop_reason() if running else None
            if reason:
                end = GangEnd(stopped=reason, still_running=tuple(sorted(running)))
                break
    finally:
        # Only members not yet reaped: a reaped member's PID (its group's) may be another's now.
        stop([member for member in members if member.returncode is None])
        for pump in pumps:
            pump.join(timeout=5)
        _relay(lines, on_line, 0)
    return end


def _queue_line(lines: queue.Queue[tuple[int, str]], index: int, line: str) -> None:
    """A member's line, for the caller's thread (`_relay`)."""
    lines.put((index, line))


def _relay(lines: queue.Queue[tuple[int, str]], on_line: Callable[[int, str], None], timeout: float) -> None:
    """Pass on every queued line, waiting up to `timeout` seconds for the first."""
    try:
        index, line = lines.get(timeout=timeout) if timeout else lines.get_nowait()
        while True:
            on_line(index, line)
            index, line = lines.get_nowait()
    except queue.Empty:
        pass
