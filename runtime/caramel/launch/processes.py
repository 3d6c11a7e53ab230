"""Child processes that cannot outlive their parent, and stopping them as whole groups.

Both `caramel run` (which starts workers) and the worker entrypoint (which starts training
processes) use these, so that no process is left behind however a run ends: normal exit,
a failed worker, Ctrl-C, or the parent itself being killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. The kernel sends SIGKILL to the child if the
    # parent dies for any reason, including SIGKILL, which no Python handler can catch.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own process group, with stdout and stderr merged into one pipe."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
        preexec_fn=_die_with_parent,
    )


def pump_lines(stream: IO[bytes], on_line: Callable[[str], None]) -> threading.Thread:
    """Call on_line for every line of stream, in a daemon thread, until the stream closes."""

    def pump() -> None:
        for raw in iter(stream.readline, b""):
            on_line(raw.decode("utf-8", errors="replace").rstrip("\n"))
        stream.close()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def stop_groups(processes: Sequence[subprocess.Popen[bytes]], grace_seconds: float = 10.0) -> None:
    """SIGTERM the process group of every process, then SIGKILL what is left after the grace period."""
    for process in processes:
        signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        # Also reaches grandchildren still in the group after their leader exited.
        signal_group(process, signal.SIGKILL)
        process.wait()


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Send `signum` to the process's group, if it still has one."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def exit_code(returncode: int) -> int:
    """A shell-style exit status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def killed_by_the_machine(returncode: int) -> bool:
    """Whether a worker, or a training process of it (whose status the entrypoint passes on as
    128 + N), was killed by SIGKILL: what the kernel's out-of-memory killer sends, and no program
    sends itself."""
    return exit_code(returncode) == 128 + signal.SIGKILL


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"
