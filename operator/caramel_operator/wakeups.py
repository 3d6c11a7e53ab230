"""Wake-ups of the jobs' reconciliations, by the changes of their pods.

Each unfinished job has a reconciling task (a kopf daemon) that passes over it every reconcile
interval, and whenever one of its worker pods changes: created, started, failed, being deleted,
gone. A pod's watch event sets its job's wake-up, after kopf has indexed it, so the pass that
follows sees the change. A pod names its job by label, so wake-ups are keyed by the job's
namespace and name; a job deleted and created again under its name registers a wake-up of its
own, which the old one's going does not take away.
"""

from __future__ import annotations

import asyncio

JobKey = tuple[str, str]
"""A job's namespace and name."""


class Wakeups:
    """The wake-up of every job whose reconciling task runs. All of it runs on kopf's event loop."""

    def __init__(self) -> None:
        self._events: dict[JobKey, asyncio.Event] = {}

    def register(self, job: JobKey) -> asyncio.Event:
        """A new wake-up for the job's reconciling task, which it waits on between passes."""
        event = self._events[job] = asyncio.Event()
        return event

    def forget(self, job: JobKey, event: asyncio.Event) -> None:
        """The task that registered `event` ends: forget it, unless a newer task of the same name's job took its place."""
        if self._events.get(job) is event:
            del self._events[job]

    def wake(self, job: JobKey) -> None:
        """One of the job's pods changed: its task passes now (or once more, after the pass under way)."""
        event = self._events.get(job)
        if event is not None:
            event.set()
