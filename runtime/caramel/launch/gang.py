"""A gang of processes started together, watched together and stopped together.

`caramel run` runs its workers as one (`launcher`), every worker its training processes
(`entrypoint`), and the benchmarks their workers in emulated network namespaces
(`benchmarks.jobrun`): each gives `run_gang` the way it starts a member. The members' output
lines are relayed on the caller's thread, in the order they come. The gang ends when every
member has exited 0, when one fails (its peers could only wait for it), or when the caller stops
it; whatever happens, no member is left running when `run_gang` returns or raises.

The failure that ends the gang is the first to happen. A member killed takes its peers down
with it within milliseconds (a connection reset, a collective aborted), so a look at every member
now and then found several failed and blamed the lowest-numbered: the peer's follow-on error, not
the member killed. Each member has a thread that waits for its exit and reports it at once,
with the moment, in the order exits happen.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
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
    failed_at: datetime | None = None
    """When it exited (UTC)."""
    stopped: str = ""
    """Why the caller stopped the gang while members still ran (`stop_reason`'s answer), where it did."""
    still_running: tuple[int, ...] = ()
    """The members that were still running when the caller stopped the gang."""

    @property
    def succeeded(self) -> bool:
        return self.failed is None and not self.stopped


@dataclass(frozen=True)
class _Exited:
    """A member's exit, as its waiting thread saw it."""

    member: int
    returncode: int
    at: datetime


def run_gang(
    size: int,
    spawn: Callable[[int], Member],
    on_line: Callable[[int, str], None],
    *,
    stop_reason: Callable[[], str | None] = lambda: None,
    on_failure: Callable[[int, int], None] = lambda member, returncode: None,
    replace: Callable[[int, int], bool] = lambda member, returncode: False,
    stop: Callable[[Sequence[Member]], None] = stop_groups,
    poll_seconds: float = 0.2,
) -> GangEnd:
    """Start members 0 to size - 1 with `spawn(member)` (a process whose stdout is a pipe, in its
    own process group), and run them until they end.

    Every line a member writes goes to `on_line(member, line)`. The first member to fail ends the
    gang (`on_failure(member, returncode)` is told at once, before its peers are stopped); after
    each line or exit, and every `poll_seconds` at least, `stop_reason()` may end it (a signal, a
    deadline). An elastic gang goes on without a failed member where `replace(member,
    returncode)` says so, and starts it again at once (its peers re-form without it, and with it
    once it is back). Before returning or raising, `stop` is given the members still running, or not
    yet reaped (`stop_groups` by default: SIGTERM to their groups, SIGKILL after a grace period),
    and their last lines are relayed. A member that cannot be started raises CannotStart.
    """
    # The members' lines and exits, in the order they happen.
    events: queue.Queue[tuple[int, str] | _Exited] = queue.Queue()
    pumps: list[threading.Thread] = []
    end = GangEnd()
    # Every process started, replaced members' included, so that none is left running.
    started: list[Member] = []

    def start(index: int) -> Member:
        try:
            member = spawn(index)
        except OSError as error:
            raise CannotStart(index, error) from error
        started.append(member)
        assert member.stdout is not None, "a member's stdout must be a pipe"
        pumps.append(pump_lines(member.stdout, partial(_queue_line, events, index)))
        threading.Thread(target=_wait_for_exit, args=(events, index, member), daemon=True).start()
        return member

    try:
        for index in range(size):
            start(index)
        running = set(range(size))
        while running:
            try:
                event = events.get(timeout=poll_seconds)
            except queue.Empty:
                event = None
            if isinstance(event, _Exited):
                running.discard(event.member)
                if event.returncode != 0 and replace(event.member, event.returncode):
                    start(event.member)
                    running.add(event.member)
                elif event.returncode != 0:
                    end = GangEnd(failed=event.member, returncode=event.returncode, failed_at=event.at)
                    on_failure(event.member, event.returncode)
                    break
            elif event is not None:
                on_line(*event)
            reason = stop_reason() if running else None
            if reason:
                end = GangEnd(stopped=reason, still_running=tuple(sorted(running)))
                break
    finally:
        # Only members not yet reaped: a reaped member's PID (its group's) may be another's now.
        stop([member for member in started if member.returncode is None])
        for pump in pumps:
            pump.join(timeout=5)
        _relay_lines(events, on_line)
    return end


def _queue_line(events: queue.Queue[tuple[int, str] | _Exited], index: int, line: str) -> None:
    """A member's line, for the caller's thread."""
    events.put((index, line))


def _wait_for_exit(events: queue.Queue[tuple[int, str] | _Exited], index: int, member: Member) -> None:
    """Report the member's exit the moment it happens (its own thread)."""
    returncode = member.wait()
    events.put(_Exited(index, returncode, datetime.now(UTC)))


def _relay_lines(events: queue.Queue[tuple[int, str] | _Exited], on_line: Callable[[int, str], None]) -> None:
    """Pass on every line still queued: the gang has ended, its exits tell nothing more."""
    while True:
        try:
            event = events.get_nowait()
        except queue.Empty:
            return
        if not isinstance(event, _Exited):
            on_line(*event)
