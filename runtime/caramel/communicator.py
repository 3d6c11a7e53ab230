"""Gradient communication for the tape and optimizer drop-ins: a whole step's gradients at once.

`tf.GradientTape` hands over every gradient together, so the communicator gives them all to a
TransferEngine in one go and waits for the averages. The engine plans and batches the
transfers, fits the link from their timings and re-plans, exactly as for layer-wise training.
Inside a `tf.function` the communicator is reached through `tf.py_function`, so the schedule
is decided in Python at run time rather than frozen into the graph.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from caramel.api import Scheduling, Tuning
from caramel.engine import INITIAL_LINK, IterationStats, TransferEngine
from caramel.linkmodel import LinkModel
from caramel.planning import Piece
from caramel.schedule import TensorCost


@dataclass
class CommunicationStats(IterationStats):
    """What the communicator did since the stats were last taken."""

    exposed_seconds: float = 0.0
    """Time the training step waited for the averages: with a whole step handed over at once,
    all of the communication."""


def initial_link(tuning: Tuning | None) -> LinkModel:
    """The link a restarted gang measured last, or a cautious guess."""
    if tuning and tuning.alpha_seconds is not None and tuning.beta_seconds_per_byte is not None:
        return LinkModel(alpha=tuning.alpha_seconds, beta=tuning.beta_seconds_per_byte)
    return INITIAL_LINK


class GradientCommunicator:
    """Averages gradients across all ranks according to the job's scheduling settings."""

    def __init__(self, scheduling: Scheduling, tuning: Tuning | None = None) -> None:
        self.scheduling = scheduling
        self._initial_link = initial_link(tuning)
        self.engine: TransferEngine | None = None
        self._signature: tuple[tuple[int, str], ...] = ()
        self._iteration = 0
        self._pieces: dict[int, list[tuple[int, tf.Tensor]]] = {}
        self._stats = CommunicationStats()
        self._lock = threading.Lock()

    def _engine_for(self, tensors: Sequence[tf.Tensor]) -> TransferEngine:
        signature = tuple((int(tf.size(t)), t.dtype.name) for t in tensors)
        if self.engine is None or signature != self._signature:
            if self.engine is not None:
                raise ValueError("the set of gradients changed between steps; Caramel plans for a fixed model")
            costs = [TensorCost(nbytes=count * t.dtype.size, item_size=t.dtype.size) for (count, _), t in zip(signature, tensors)]
            self.engine = TransferEngine(costs, self.scheduling, self._store_piece, self._initial_link)
            self._signature = signature
        return self.engine

    def _store_piece(self, piece: Piece, average: tf.Tensor) -> None:
        self._pieces.setdefault(piece.tensor, []).append((piece.start, average))

    def allreduce(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The average of every tensor over all ranks."""
        engine = self._engine_for(tensors)
        iteration = self._iteration
        started = time.perf_counter()
        for index, tensor in enumerate(tensors):
            engine.gradient_ready(iteration, index, tensor)
        engine.wait_all_updated(iteration)
        waited = time.perf_counter() - started
        results = []
        for index, tensor in enumerate(tensors):
            parts = [part for _, part in sorted(self._pieces.pop(index), key=lambda item: item[0])]
            joined = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
            results.append(tf.reshape(joined, tf.shape(tensor)))
        stats = engine.stats(iteration)
        with self._lock:
            self._stats.communication_seconds += stats.communication_seconds
            self._stats.waiting_seconds += stats.waiting_seconds
            self._stats.exposed_seconds += waited
            self._stats.nbytes += stats.nbytes
            self._stats.transfers += stats.transfers
        self._iteration += 1
        return results

    def take_stats(self) -> CommunicationStats:
        """The stats since the last call, resetting them."""
        with self._lock:
            stats, self._stats = self._stats, CommunicationStats()
        return stats
