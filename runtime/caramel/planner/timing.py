"""What one training step's timestamps say: how long each transfer held the link, when each gradient came.

The TensorFlow side stamps, inside the step's graph and on one clock per process, the moment
each planned transfer's gradients all exist and the moment it completes; in the first step of
each execution also the moment each gradient exists (its release). Turned into durations here,
they feed the metrics, the link model (alpha and beta) and the planner's release times
(TicTac's TAC: measured compute instead of assumed), with no Python on the step's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from caramel.planner.transfers import Transfer

# Forward passes are not timed, only the moments gradients exist: each layer's forward pass is
# taken as this share of its backward pass (a layer's forward pass computes its output, its
# backward pass the gradients of both its input and its weights).
FORWARD_SHARE_OF_BACKWARD = 0.5


@dataclass(frozen=True)
class StepStamps:
    """One step's stamps, in seconds on the process's clock."""

    started: float
    """When the execution holding the step started."""

    transfers_ready: tuple[float, ...]
    """When each planned transfer's gradients all existed, in plan order."""

    transfers_done: tuple[float, ...]
    """When each planned transfer completed, in plan order."""

    releases: tuple[float, ...] | None = None
    """When each gradient existed, in the order of the step's gradients (stamped in the first
    step of each execution only: once is enough for the planner, and stamps cost graph ops)."""


@dataclass(frozen=True)
class TransferTiming:
    """How long one transfer held the link: from when it could have started (its gradients there,
    the transfer before it done) to its end. Hand-overs between transfers count, since a plan
    pays them for every transfer."""

    nbytes: int
    seconds: float


@dataclass(frozen=True)
class StepTimes:
    """Durations derived from one step's stamps."""

    transfers: tuple[TransferTiming, ...]
    backward_seconds: tuple[float, ...] | None
    """Per gradient: the backward compute that released it (see `backward_seconds_from_releases`);
    None where the step's releases were not stamped."""
    communication_seconds: float
    """Time the link was busy with this step's transfers."""
    transfer_wait_seconds: float
    """Time the link stood idle waiting for this step's gradients."""
    exposed_seconds: float
    """Time the step waited for communication: in its forward pass for parameters still in
    transfer (beyond the execution's first step, which cannot wait), and, for the last step of
    an execution, after its backward pass for its last transfers."""

    @property
    def nbytes(self) -> int:
        return sum(transfer.nbytes for transfer in self.transfers)


def backward_seconds_from_releases(released: Sequence[float], started: float | None = None) -> list[float]:
    """Backward times that reproduce these release times (any origin), as far as they follow
    backpropagation's order (last tensor first): a gradient that came earlier than the one
    after it in the model counts as released with it.

    The backward pass of the last layer, before the first gradient exists, shows in no gap
    between releases. With `started`, when the step started on the same clock (a step that
    waited for no parameter: the first of an execution), the last tensor's backward time holds
    it: what the span from the start to the first release leaves beside the forward pass
    (`FORWARD_SHARE_OF_BACKWARD` of the whole backward pass, that layer's included). A model
    whose last layer computes much for few parameters (a transformer's projection onto its
    vocabulary: a sixth of T5-small's step) otherwise looks as if its first gradient came at
    once, and its plans expected the link to idle that much less each step than it does."""
    backward = [0.0] * len(released)
    later = min(released, default=0.0)  # when the gradient after this one was released
    for index in reversed(range(len(released))):
        backward[index] = max(0.0, released[index] - later)
        later = max(later, released[index])
    if started is not None and backward:
        span = min(released) - started  # the forward pass, and the last layer's backward pass
        backward[-1] += max(0.0, (span - FORWARD_SHARE_OF_BACKWARD * sum(backward)) / (1 + FORWARD_SHARE_OF_BACKWARD))
    return backward


def execution_times(steps: Sequence[StepStamps], transfers: Sequence[Transfer]) -> list[StepTimes]:
    """The durations of the steps of one execution, run with this plan.

    A step starts when the one before it ended its backward pass (its last transfer's gradients
    existed), the first when the execution started. The first step's forward span (start to
    its first transfer's gradients) cannot include a wait for a parameter, since the execution
    started after every update of the one before; a later step's longer span is time it waited
    for a parameter still in transfer.
    """
    times: list[StepTimes] = []
    started = steps[0].started if steps else 0.0
    link_free = started
    unhindered_span = 0.0
    for index, stamps in enumerate(steps):
        if not len(stamps.transfers_done) == len(stamps.transfers_ready) == len(transfers):
            raise ValueError(
                f"{len(stamps.transfers_ready)} and {len(stamps.transfers_done)} transfer stamps for a plan of {len(transfers)} transfers"
            )
        span = max(0.0, min(stamps.transfers_ready) - started)
        if index == 0:
            unhindered_span = span
        exposed = max(0.0, span - unhindered_span)
        timings, waited = [], 0.0
        for transfer, ready, done in zip(transfers, stamps.transfers_ready, stamps.transfers_done):
            waited += max(0.0, ready - link_free)
            timings.append(TransferTiming(transfer.nbytes, max(0.0, done - max(ready, link_free))))
            link_free = max(link_free, done)
        started = max(stamps.transfers_ready)
        if index == len(steps) - 1:
            exposed += max(0.0, max(stamps.transfers_done) - started)
        times.append(
            StepTimes(
                transfers=tuple(timings),
                backward_seconds=tuple(backward_seconds_from_releases(stamps.releases, stamps.started if index == 0 else None)) if stamps.releases else None,
                communication_seconds=sum(timing.seconds for timing in timings),
                transfer_wait_seconds=waited,
                exposed_seconds=exposed,
            )
        )
    return times


def typical_backward_seconds(steps: Sequence[StepTimes]) -> list[float] | None:
    """Per gradient, the median backward time over the steps that stamped their releases (one
    slow step does not move a plan); None if none did."""
    measured = [step.backward_seconds for step in steps if step.backward_seconds is not None]
    if not measured:
        return None
    return [float(value) for value in np.median(np.array(measured), axis=0)]
