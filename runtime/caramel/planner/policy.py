"""How gradients are planned and sent: Caramel's own way, or another method's piece in its place.

The default `PlanningPolicy()` is what every job runs. Another one swaps a piece of Caramel's
scheduling for another method's (Horovod's order, fixed buckets, DeAR's split collectives), so that
a benchmark can tell what each piece is worth (benchmarks/README.md, the anchors). None of them
measured faster than Caramel's own choice, so a job does not offer them: the benchmarks' and
tests' training scripts hand one to the runtime before it starts
(`caramel.tensorflow.runtime.plan_with`, testbed/lab.py), which gives it to the planner it builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import TypeAdapter


class Ordering(StrEnum):
    """The order in which gradients are transferred."""

    TIC = "tic"
    """First the parameters the next forward pass reads first (TicTac): Caramel's."""

    ARRIVAL = "arrival"
    """The order backpropagation produces gradients in (Horovod's)."""


class Batching(StrEnum):
    """How gradients are grouped into transfers."""

    AUTO = "auto"
    """The search chooses the buckets within spec.caramel's bucket bounds: Caramel's."""

    FIXED = "fixed"
    """Buckets of up to spec.caramel.maxBucketBytes (with minBucketBytes, ByteScheduler's partitions)."""

    OFF = "off"
    """Every tensor on its own."""


class Collective(StrEnum):
    """How a planned transfer averages its gradients."""

    ALLREDUCE = "allreduce"
    """One all-reduce per transfer: Caramel's."""

    SPLIT = "split"
    """DeAR's decoupling: each transfer reduce-scattered as soon as its gradients exist and
    all-gathered after the step's last reduce-scatter, in the order the next forward pass reads
    the parameters. Horovod's backend only: TensorFlow has no reduce-scatter on the CPU."""


@dataclass(frozen=True)
class PlanningPolicy:
    """The choices the planner's search, the replanner and the gradient communicator follow; the
    defaults are Caramel's own."""

    ordering: Ordering = Ordering.TIC
    batching: Batching = Batching.AUTO
    collective: Collective = Collective.ALLREDUCE
    first_plan_waits: bool = False
    """The steps wait for the first plan's search, which is decided at the boundary where it
    started; otherwise it runs beside them and is decided at the first boundary after it ended.
    For tests and steady-state benchmark runs, whose steps of a few milliseconds must reach
    Caramel's graph at a known step."""
    long_training: bool = False
    """The first plan goes on to several steps per graph whatever the steps left: the few
    measured steps of a benchmark or test stand for a long training's steady state, not for a job
    as short as they are."""


POLICY = TypeAdapter(PlanningPolicy)
"""A policy to and from JSON: the plan search's request (`caramel.planner.search`), the
benchmarks' lab settings (testbed/lab.py)."""
