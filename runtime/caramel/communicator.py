"""Gradient communication: every allreduce of a Caramel training process goes through here.

The communicator executes a transfer plan (see `caramel.planning`) with Horovod collectives,
eagerly, and keeps count of the time and bytes spent, which the per-step metrics report.
Inside a `tf.function` it is reached through `tf.py_function`, so that the schedule is decided
in Python at run time rather than frozen into the graph.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.api import Scheduling, Tuning
from caramel.planning import Transfer, bucket_limit, plan_transfers


@dataclass
class CommunicationStats:
    """What the communicator did since the stats were last taken."""

    seconds: float = 0.0
    nbytes: int = 0
    transfers: int = 0


class GradientCommunicator:
    """Averages gradients across all ranks according to the job's scheduling settings."""

    def __init__(self, scheduling: Scheduling, tuning: Tuning | None = None) -> None:
        self.scheduling = scheduling
        self.bucket_bytes = bucket_limit(scheduling, tuning)
        self._plans: dict[tuple[tuple[int, str], ...], list[Transfer]] = {}
        self._stats = CommunicationStats()
        self._lock = threading.Lock()

    def plan_for(self, tensors: Sequence[tf.Tensor]) -> list[Transfer]:
        """The transfer plan for tensors of these sizes and types (cached: models keep their shapes)."""
        signature = tuple((int(tf.size(t)), t.dtype.name) for t in tensors)
        plan = self._plans.get(signature)
        if plan is None:
            plan = plan_transfers(
                [count for count, _ in signature], [t.dtype.size for t in tensors], self.scheduling, self.bucket_bytes
            )
            self._plans[signature] = plan
        return plan

    def allreduce(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The average of every tensor over all ranks, computed eagerly along the plan."""
        started = time.perf_counter()
        plan = self.plan_for(tensors)
        flat = [tf.reshape(t, [-1]) for t in tensors]
        reduced_pieces: dict[int, list[tuple[int, tf.Tensor]]] = {i: [] for i in range(len(tensors))}
        for transfer in plan:
            inputs = [flat[p.tensor][p.start : p.stop] for p in transfer.pieces]
            outputs = hvd.grouped_allreduce(inputs, op=hvd.Average)
            for piece, output in zip(transfer.pieces, outputs):
                reduced_pieces[piece.tensor].append((piece.start, output))
        results = []
        for index, tensor in enumerate(tensors):
            pieces = [output for _, output in sorted(reduced_pieces[index], key=lambda item: item[0])]
            joined = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=0)
            results.append(tf.reshape(joined, tf.shape(tensor)))
        with self._lock:
            self._stats.seconds += time.perf_counter() - started
            self._stats.nbytes += sum(transfer.nbytes for transfer in plan)
            self._stats.transfers += len(plan)
        return results

    def take_stats(self) -> CommunicationStats:
        """The stats since the last call, resetting them."""
        with self._lock:
            stats, self._stats = self._stats, CommunicationStats()
        return stats
