"""The pass being decided (`Pass`: the new status, the actions, the reads, the Events) and the
edits every step makes to it; and the gang's sizes as its status says them so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from caramel.contract.api import CaramelJobStatus, ConditionType, GangSize, Phase
from caramel_operator.lifecycle.actions import Action, DeletePods, Event, Read
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.status import with_condition
from caramel_operator.observe import NODE_LOST_REASONS, WorkerObservation


@dataclass
class Pass:
    status: CaramelJobStatus
    now: datetime
    """When the pass is decided: the time its timestamps and conditions take."""
    actions: list[Action] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    """What the handler is to read and give the pass again (Observed), for it to decide from."""
    events: list[Event] = field(default_factory=list)
    transitions: list[Phase] = field(default_factory=list)
    """Phases entered, for the operator's counters."""

    def update(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def condition(self, kind: ConditionType, holds: bool, reason: str, message: str = "") -> None:
        self.status = with_condition(self.status, kind, holds, reason, message, self.now)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.events.append(Event(kind, reason, message))

    def enter(self, phase: Phase) -> None:
        # A wait of the gang before is no reason to keep quiet about the next one.
        self.update(phase=phase, pending_reason="")
        self.transitions.append(phase)

    def delete(self, workers: list[WorkerObservation]) -> None:
        if not workers:
            return
        lost = [w.name for w in workers if w.failure_reason in NODE_LOST_REASONS]
        others = [w.name for w in workers if w.failure_reason not in NODE_LOST_REASONS]
        if lost:
            self.actions.append(DeletePods(lost, force=True))
        if others:
            self.actions.append(DeletePods(others))


def size_on_record(seen: Observed, p: Pass) -> GangSize:
    """The size on record; before the first gang, the whole gang's (no gang is sized yet)."""
    return p.status.size or GangSize(gang=-1, workers=seen.replicas, next_min_workers=seen.replicas)


def update_size(seen: Observed, p: Pass, **changes: Any) -> None:
    p.update(size=size_on_record(seen, p).model_copy(update=changes))


def gang_size(p: Pass) -> int | None:
    """Workers of the current gang, or None while it is not yet sized (created)."""
    size = p.status.size
    return size.workers if size and size.gang == p.status.gang else None


def current_gang_size(seen: Observed, p: Pass) -> int:
    """Workers the current gang has, or will have as far as is known yet."""
    return gang_size(p) or seen.replicas


def next_min_workers(seen: Observed, p: Pass) -> int:
    """The fewest workers the next gang may start with, within the spec as it is now."""
    return min(seen.replicas, max(seen.min_workers, size_on_record(seen, p).next_min_workers))


def of_replicas(seen: Observed, workers: int) -> str:
    return f"all {workers} workers" if workers == seen.replicas else f"{workers} of {seen.replicas} workers"
