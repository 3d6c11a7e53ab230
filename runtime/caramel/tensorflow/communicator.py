"""Gradient communication for the tape and optimizer drop-ins.

Inside a `tf.function` each gradient is handed over to a TransferEngine the moment
backpropagation produces it (`hand_over`, reached through a `tf.py_function`), so its transfer
overlaps the rest of backpropagation, and the step then waits for all the averages (`collect`).
Eagerly, `tf.GradientTape` produces every gradient together and `allreduce` hands them over in
one go. Either way the engine plans and batches the transfers, fits the link from their
timings and re-plans, exactly as for layer-wise training, and the schedule is decided in
Python at run time rather than frozen into the graph.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from caramel.job.api import Scheduling, Tuning
from caramel.tensorflow.engine import INITIAL_LINK, IterationStats, TransferEngine
from caramel.planner.linkmodel import LinkModel
from caramel.planner.transfers import Piece
from caramel.planner.schedule import TensorCost


# What the engine plans for: every gradient's element count and dtype name, in order.
Signature = tuple[tuple[int, str], ...]


def signature_of(tensors: Sequence[tf.Tensor]) -> Signature:
    """The signature of tensors whose shapes are known (eager tensors, or static graph shapes)."""
    return tuple((tensor.shape.num_elements(), tensor.dtype.name) for tensor in tensors)


@dataclass
class CommunicationStats(IterationStats):
    """What the communicator did since the stats were last taken."""

    exposed_seconds: float = 0.0
    """Time the training step waited for the averages once it had handed over every gradient."""


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
        self._signature: Signature = ()
        self._iteration = 0
        self._pieces: dict[int, list[tuple[int, tf.Tensor]]] = {}
        self._stats = CommunicationStats()
        self._lock = threading.Lock()

    def _engine_for(self, signature: Signature) -> TransferEngine:
        if self.engine is None or signature != self._signature:
            if self.engine is not None:
                raise ValueError("the set of gradients changed between steps; Caramel plans for a fixed model")
            costs = []
            for elements, dtype_name in signature:
                item_size = tf.as_dtype(dtype_name).size
                costs.append(TensorCost(nbytes=elements * item_size, item_size=item_size))
            self.engine = TransferEngine(costs, self.scheduling, self._store_piece, self._initial_link)
            self._signature = signature
        return self.engine

    def _store_piece(self, piece: Piece, average: tf.Tensor) -> None:
        self._pieces.setdefault(piece.tensor, []).append((piece.start, average))

    def allreduce(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The average of every tensor over all ranks, all handed over at once."""
        signature = signature_of(tensors)
        for index, tensor in enumerate(tensors):
            self.hand_over(signature, index, tensor)
        return self.collect([tensor.shape for tensor in tensors])

    def hand_over(self, signature: Signature, index: int, gradient: tf.Tensor) -> None:
        """Gradient `index` of the step's gradients (described by `signature`) exists: its
        transfer may start."""
        self._engine_for(signature).gradient_ready(self._iteration, index, gradient)

    def collect(self, shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
        """The averages of the step's gradients, of these shapes, once every one was handed over."""
        engine = self._engine_for(self._signature)
        iteration = self._iteration
        started = time.perf_counter()
        engine.wait_all_updated(iteration)
        waited = time.perf_counter() - started
        results = []
        for index, shape in enumerate(shapes):
            parts = [part for _, part in sorted(self._pieces.pop(index), key=lambda item: item[0])]
            joined = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
            results.append(tf.reshape(joined, shape))
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
