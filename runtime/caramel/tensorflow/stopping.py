"""How a training process stops when it is asked to: SIGTERM, which its worker passes on when a
pod is deleted, a gang restarts, a job is suspended or `caramel run` stops.

TensorFlow's coordination service, which the tensorflow backend starts as
MultiWorkerMirroredStrategy does, takes SIGTERM for itself (its preemption notifier logs "SIGTERM
caught" and carries on). A worker asked to stop went on training for its entrypoint's whole grace
period, 10 s, and its gang went on writing checkpoints, until SIGKILL. So once the backend is set
up, Caramel takes SIGTERM back (`install`), on every backend alike:

- The process exits, with status 143 as SIGTERM's default would, as soon as its main thread is
  back in Python: Python runs a signal handler between two bytecodes, never inside a TensorFlow
  call, so a graph of steps under way ends first. In Caramel's loops (`TrainingRun`, the Keras
  callback) that is the next step boundary; in a script's own loop (Horovod's API) the next
  boundary between two of its TensorFlow calls, which is at the latest the end of the step.
- Nothing is written after the signal: the process leaves through `os._exit`, so no exit handler
  runs (the weights check, Horovod's shutdown: collectives with peers that are stopping too), no
  `finally` of the script, and no checkpoint starts. One that was being written is cut where it
  is; TensorFlow writes a checkpoint under a temporary name and names it latest last, so the
  latest checkpoint is the one before.
- A step that has not ended STOP_SECONDS after the signal is cut short: a thread woken by the
  signal itself (`signal.set_wakeup_fd`), not by the main thread, ends the process then.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import NoReturn

STOP_SIGNAL = signal.SIGTERM
EXIT_STATUS = 128 + STOP_SIGNAL
"""The status SIGTERM's default action leaves, as a shell reports it."""
STOP_SECONDS = 1.0
"""The longest a training process goes on after SIGTERM, so that its worker, which then reaps it
and stops its own rendezvous server, exits within 2 s."""

_installed = False
_leaving = threading.Lock()
"""Held by the thread that ends the process: the main thread, or the deadline's."""


def install() -> None:
    """Take SIGTERM for Caramel's stop (once per process; from the main thread, after the backend,
    whose set-up installs TensorFlow's handler)."""
    global _installed
    if _installed:
        return
    _installed = True
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(STOP_SIGNAL, _stop_now)
    # Python's own handler writes the number of every signal it catches here, at once, whatever
    # the main thread is doing.
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_cut_short_after_the_deadline, args=(read_end,), name="caramel-stop", daemon=True).start()


def _stop_now(signum: int, frame: FrameType | None) -> NoReturn:
    """The main thread, back in Python after the signal."""
    # The worker sends SIGTERM again as it stops its ranks: that one must not run this handler
    # again midway (Python would, between any two of its calls).
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, RuntimeError, ValueError):
            pass  # a write this handler interrupted (a reentrant call), or a stream closed
    _leave("stopped by SIGTERM: exiting at once, writing nothing more (the latest checkpoint stands)")


def _cut_short_after_the_deadline(read_end: int) -> None:
    while STOP_SIGNAL not in os.read(read_end, 64):
        pass
    time.sleep(STOP_SECONDS)
    # The main thread has not come back from TensorFlow: a step (or a collective waiting for a
    # peer) longer than the deadline. Its streams may be held by it: write past them.
    _leave(f"stopped by SIGTERM: the step under way did not end within {STOP_SECONDS:g} s; exiting without it")


def _leave(message: str) -> NoReturn:
    _leaving.acquire()  # the other thread is ending the process already, if it holds it
    try:
        os.write(2, f"caramel: {message}\n".encode())
    except OSError:
        pass  # no one reads the process's output any more: it exits all the same
    os._exit(EXIT_STATUS)
