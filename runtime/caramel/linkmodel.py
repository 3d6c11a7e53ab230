"""The alpha-beta cost of a transfer, estimated from the transfers observed.

An allreduce of b bytes takes about alpha + beta * b seconds: alpha is the fixed cost of one
collective (negotiation, ring latency), beta the inverse of the effective bandwidth. The
planner weighs fewer, larger transfers (less alpha) against earlier, smaller ones (more
overlap) with it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

# Real transfers remembered for the bandwidth: enough to span several steps, few enough to
# forget a link that changed speed within a few steps.
OBSERVATION_WINDOW = 256
# Below this many real transfers in the window, the probes' bandwidth is used instead.
MIN_TRANSFER_SAMPLES = 8
# No collective costs less than this here (Python, TensorFlow and Horovod's negotiation): a
# lower alpha, from noise, would plan thousands of tiny transfers.
ALPHA_FLOOR_SECONDS = 1e-4
# A collective waits for the slowest rank, which only ever adds time: the low quartile of the
# per-byte costs is the link's own.
BANDWIDTH_QUANTILE = 25


@dataclass(frozen=True)
class LinkModel:
    alpha: float
    """Seconds of fixed cost per transfer."""

    beta: float
    """Seconds per byte."""

    def seconds(self, nbytes: int) -> float:
        return self.alpha + self.beta * nbytes

    @property
    def bytes_per_second(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else float("inf")


class LinkObserver:
    """What one process saw of the link: synchronised probes, and the real transfers' timings.

    Probes run back to back right after every rank met, so their times are the link's, fixed
    cost included: they give alpha (and a first beta). Real transfers overlap and wait for the
    slowest rank, so they only refine beta, through a low quantile of their per-byte cost.
    """

    def __init__(self, window: int = OBSERVATION_WINDOW) -> None:
        self._probes: dict[int, float] = {}
        self._transfers: deque[tuple[int, float]] = deque(maxlen=window)

    def observe_probe(self, nbytes: int, seconds: float) -> None:
        """A probe transfer; the fastest of a round's repeats counts."""
        self._probes[nbytes] = min(seconds, self._probes.get(nbytes, float("inf")))

    def new_probe_round(self) -> None:
        self._probes.clear()

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        self._transfers.append((nbytes, seconds))

    def model(self, previous: LinkModel) -> LinkModel:
        """The link as last seen; what could not be measured is taken from `previous`.

        alpha is the smallest probe's time. beta comes from the real transfers when there are
        enough, else from the large probe, whose time on a fast link can drown in noise: a
        probe that did not outlast alpha measured nothing.
        """
        if not self._probes:
            return previous
        smallest, largest = min(self._probes), max(self._probes)
        alpha = max(ALPHA_FLOOR_SECONDS, self._probes[smallest])
        beta = previous.beta
        if largest > smallest and self._probes[largest] > alpha:
            beta = (self._probes[largest] - alpha) / (largest - smallest)
        if len(self._transfers) >= MIN_TRANSFER_SAMPLES:
            per_byte = [max(0.0, seconds - alpha) / nbytes for nbytes, seconds in self._transfers]
            observed = float(np.percentile(per_byte, BANDWIDTH_QUANTILE))
            beta = observed if observed > 0 else beta
        return LinkModel(alpha=alpha, beta=beta)
