"""Laboratory settings: the scheduling ablations the benchmarks run, and no part of the CaramelJob API.

Each one swaps a piece of Caramel's scheduling for another method's (Horovod's order, fixed
buckets, DeAR's split collectives), so that a benchmark can tell what each piece is worth
(benchmarks/README.md, the anchors). None of them measured faster than Caramel's own choice,
so a job does not offer them: a benchmark sets them in its job's environment, as JSON in
CARAMEL_LAB_SCHEDULING (`lab_variables`), which every training process reads with its contract.
One more is for the tests: `first_plan_waits`, which makes the steps wait for the first plan's
search, so that a test of a few milliseconds' steps reaches Caramel's graph at a known step.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

LAB_SCHEDULING = "CARAMEL_LAB_SCHEDULING"


class Ordering(StrEnum):
    """The order in which gradients are transferred."""

    AUTO = "auto"
    """Caramel's choice, which is tic."""

    TIC = "tic"
    """First the parameters the next forward pass reads first (TicTac)."""

    ARRIVAL = "arrival"
    """The order backpropagation produces gradients in (Horovod's)."""


class Batching(StrEnum):
    """How gradients are grouped into transfers."""

    AUTO = "auto"
    """Caramel plans the buckets within spec.caramel's bucket bounds."""

    FIXED = "fixed"
    """Buckets of up to spec.caramel.maxBucketBytes (with minBucketBytes, ByteScheduler's partitions)."""

    OFF = "off"
    """Every tensor on its own."""


class Collective(StrEnum):
    """How a planned transfer averages its gradients."""

    ALLREDUCE = "allreduce"
    """One all-reduce per transfer."""

    SPLIT = "split"
    """DeAR's decoupling: each transfer reduce-scattered as soon as its gradients exist and
    all-gathered after the step's last reduce-scatter, in the order the next forward pass reads
    the parameters. Horovod's backend only: TensorFlow has no reduce-scatter on the CPU."""


class LabScheduling(BaseModel):
    """The ablations in force; the defaults are what every job runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    ordering: Ordering = Ordering.AUTO
    batching: Batching = Batching.AUTO
    collective: Collective = Collective.ALLREDUCE
    first_plan_waits: bool = False
    """The steps wait for the first plan's search, which is decided at the boundary where it
    started; otherwise it runs beside them and is decided at the first boundary after it ended."""

    @classmethod
    def parse(cls, text: str | None) -> LabScheduling:
        """The settings of CARAMEL_LAB_SCHEDULING's value (unset or empty: the defaults)."""
        if not text:
            return cls()
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors())
            raise RuntimeError(f"{LAB_SCHEDULING}: {problems}") from None


def lab_variables(**settings: Any) -> dict[str, str]:
    """The environment of a job's training processes that sets these ablations."""
    return {LAB_SCHEDULING: json.dumps(LabScheduling(**settings).model_dump(mode="json"))}
