"""The job's status as the lifecycle reads and writes it: its timestamps and conditions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from caramel.contract.api import CaramelJobStatus, Condition, ConditionType, Phase

FINISHED = {Phase.SUCCEEDED, Phase.FAILED}


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def status_from(raw: dict[str, Any] | None) -> CaramelJobStatus:
    """The job's status as last written, ignoring what other writers keep there."""
    raw = raw or {}
    known = {
        key: value
        for key, value in raw.items()
        if key in CaramelJobStatus.model_fields or key in {f.alias for f in CaramelJobStatus.model_fields.values()}
    }
    return CaramelJobStatus.model_validate(known)


def with_condition(
    status: CaramelJobStatus, kind: ConditionType, holds: bool, reason: str, message: str, now: datetime
) -> CaramelJobStatus:
    """The status with one condition set; its transition time moves only when it flips."""
    value = "True" if holds else "False"
    previous = next((c for c in status.conditions if c.type is kind), None)
    if previous is None and not holds:
        return status
    since = previous.last_transition_time if previous and previous.status == value else timestamp(now)
    condition = Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=since)
    others = [c for c in status.conditions if c.type is not kind]
    order = list(ConditionType)
    return status.model_copy(update={"conditions": sorted([*others, condition], key=lambda c: order.index(c.type))})
