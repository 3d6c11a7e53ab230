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
# A size group of real transfers speaks once it has this many.
MIN_GROUP_SAMPLES = 3
# Marks the slots of `LinkObserver.transfer_seconds` beyond the transfers remembered.
UNOBSERVED = -1.0
# No collective costs less than this here (Python, TensorFlow and Horovod's negotiation): a
# lower alpha, from noise, would plan thousands of tiny transfers.
ALPHA_FLOOR_SECONDS = 1e-4


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


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (alpha, beta) through (bytes, seconds) points; None unless sizes differ."""
    sizes = np.array([p[0] for p in points], dtype=np.float64)
    seconds = np.array([p[1] for p in points], dtype=np.float64)
    if len(points) < 2 or np.ptp(sizes) == 0:
        return None
    beta, alpha = np.polyfit(sizes, seconds, 1)
    return float(alpha), float(beta)


class LinkObserver:
    """What one process saw of the link: synchronised probes, and the real transfers' timings.

    Probes run back to back right after every rank met: the best case of a collective, and a
    first model before any real transfer. Real transfers carry every cost a plan pays (the
    runtime's own handling included): they are grouped by size (powers of two), each group's
    median stands for it, and a least-squares line through those gives alpha and beta. The
    median, not a best case: a plan pays a slow collective as often as it comes, so a plan
    made from best cases is too tight to keep. The probes' alpha is the floor.

    One process's timing of a transfer also holds its wait for the last rank to get there,
    which is compute skew, not the link: a plan cannot shorten it by sending other sizes, and
    it differs between ranks and runs, so widely on a busy machine that fits of one link
    disagreed by an order of magnitude and more. So the model is fitted to the timings all ranks agreed on
    (`transfer_seconds`, least over ranks: the last rank to arrive did not wait).
    """

    def __init__(self, window: int = OBSERVATION_WINDOW) -> None:
        self._probes: dict[int, float] = {}
        self._window = window
        self._transfers: deque[tuple[int, float]] = deque(maxlen=window)

    def observe_probe(self, nbytes: int, seconds: float) -> None:
        """A probe transfer; the fastest of a round's repeats counts."""
        self._probes[nbytes] = min(seconds, self._probes.get(nbytes, float("inf")))

    def new_probe_round(self) -> None:
        self._probes.clear()

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        self._transfers.append((nbytes, seconds))

    def transfer_seconds(self) -> np.ndarray:
        """The durations of the transfers remembered, oldest first, padded with UNOBSERVED to
        the window's length: the same shape on every rank, so that ranks agree on them in one
        collective."""
        durations = np.full(self._window, UNOBSERVED, dtype=np.float64)
        durations[: len(self._transfers)] = [seconds for _, seconds in self._transfers]
        return durations

    def model(self, previous: LinkModel, transfer_seconds: np.ndarray | None = None) -> LinkModel:
        """The link as last seen; what could not be measured is taken from `previous`.
        `transfer_seconds`, shaped as `transfer_seconds()`, replaces this process's durations of
        the transfers remembered (UNOBSERVED drops one)."""
        probed = self._probed(previous)
        durations = self.transfer_seconds() if transfer_seconds is None else transfer_seconds
        groups: dict[int, list[tuple[int, float]]] = {}
        for (nbytes, _), seconds in zip(self._transfers, durations):
            if seconds == UNOBSERVED:
                continue
            groups.setdefault(int(nbytes).bit_length(), []).append((nbytes, seconds))
        points = []
        for members in groups.values():
            if len(members) >= MIN_GROUP_SAMPLES:
                sizes = [m[0] for m in members]
                points.append((float(np.median(sizes)), float(np.median([m[1] for m in members]))))
        line = _fit_line(points)
        if line is None or line[1] <= 0:
            return probed
        return LinkModel(alpha=max(probed.alpha, line[0]), beta=line[1])

    def _probed(self, previous: LinkModel) -> LinkModel:
        """The probes' model: alpha from the smallest, beta from the largest, if it outlasted alpha
        (on a fast link a 4 MiB probe can drown in noise)."""
        if not self._probes:
            return previous
        smallest, largest = min(self._probes), max(self._probes)
        alpha = max(ALPHA_FLOOR_SECONDS, self._probes[smallest])
        beta = previous.beta
        if largest > smallest and self._probes[largest] > alpha:
            beta = (self._probes[largest] - alpha) / (largest - smallest)
        return LinkModel(alpha=alpha, beta=beta)
