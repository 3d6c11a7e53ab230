"""The alpha-beta cost of a transfer, fitted from the transfers observed.

An allreduce of b bytes takes about alpha + beta * b seconds: alpha is the fixed cost of one
collective (negotiation, ring latency), beta the inverse of the effective bandwidth. The
planner weighs fewer, larger transfers (less alpha) against earlier, smaller ones (more
overlap) with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# Transfers remembered for the fit: enough to span several steps of a model with hundreds of
# tensors, few enough to forget a link that changed speed within a few steps.
OBSERVATION_WINDOW = 256


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


def fit(observations: Iterable[tuple[int, float]]) -> LinkModel | None:
    """Least-squares alpha and beta from (bytes, seconds) pairs; None until sizes vary enough.

    A negative intercept (noise on few sizes) is refitted through the origin: alpha is never
    negative and beta always positive.
    """
    pairs = np.array(list(observations), dtype=np.float64)
    if len(pairs) < 2:
        return None
    sizes, seconds = pairs[:, 0], pairs[:, 1]
    if np.ptp(sizes) == 0:
        return None
    beta, alpha = np.polyfit(sizes, seconds, 1)
    if alpha < 0 or beta <= 0:
        alpha = 0.0
        beta = float(np.dot(sizes, seconds) / np.dot(sizes, sizes))
    if beta <= 0:
        return None
    return LinkModel(alpha=float(alpha), beta=float(beta))


class LinkObserver:
    """The recent transfers of one process, and the link model they imply."""

    def __init__(self, window: int = OBSERVATION_WINDOW) -> None:
        self._observations: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, nbytes: int, seconds: float) -> None:
        self._observations.append((nbytes, seconds))

    def model(self) -> LinkModel | None:
        return fit(self._observations)

    def clear(self) -> None:
        self._observations.clear()
