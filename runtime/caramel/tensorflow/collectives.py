"""The planned transfers of a step, as Horovod collectives inside the step's graph.

Each planned transfer is one grouped allreduce of its pieces (slices of flattened gradients).
Horovod's ops are asynchronous and not stateful: in a graph each one is handed to Horovod's
background thread as soon as its inputs exist, and only data or control dependencies order
them. The plan's order is kept with control dependencies: a transfer is issued no earlier than
the gradients of the transfer before it exist, and at most `window` transfers are in flight
(issued and not finished), so that when one ends the next is already queued in Horovod and no
thread hand-over sits on the link's path. The chain continues from one step to the next within
one graph, so the window spans the steps of a multi-step execution.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.planner.transfers import Transfer

# Horovod's default HOROVOD_CACHE_CAPACITY.
HOROVOD_CACHE_CAPACITY = 1024
# Collectives in flight at once: with two, the next transfer is already queued in Horovod when
# the current one ends.
TRANSFERS_IN_FLIGHT = 2

Reduce = Callable[[list[tf.Tensor], str], list[tf.Tensor]]
"""Averages a transfer's pieces over all ranks in the graph: (pieces, name) -> averages."""


def per_dtype(pieces: list[tf.Tensor], name: str, average_group: Reduce) -> list[tf.Tensor]:
    """The pieces averaged by `average_group`, one call per dtype: a collective moves one dtype."""
    outputs: list[tf.Tensor | None] = [None] * len(pieces)
    for dtype in dict.fromkeys(piece.dtype for piece in pieces):
        members = [i for i, piece in enumerate(pieces) if piece.dtype == dtype]
        for i, averaged in zip(members, average_group([pieces[i] for i in members], f"{name}_{dtype.name}")):
            outputs[i] = averaged
    return outputs


def average_per_dtype(pieces: list[tf.Tensor], name: str, average_flat: Callable[[tf.Tensor, str], tf.Tensor]) -> list[tf.Tensor]:
    """The pieces joined into one flat buffer per dtype, each averaged by `average_flat`, and
    cut back into the pieces' shapes."""

    def joined(group: list[tf.Tensor], group_name: str) -> list[tf.Tensor]:
        flat = [tf.reshape(piece, [-1]) for piece in group]
        averaged = average_flat(flat[0] if len(flat) == 1 else tf.concat(flat, axis=0), group_name)
        parts = [averaged] if len(group) == 1 else tf.split(averaged, [piece.shape.num_elements() for piece in group])
        return [tf.reshape(part, piece.shape) for part, piece in zip(parts, group)]

    return per_dtype(pieces, name, joined)


def response_cache_capacity() -> int:
    """How many negotiations Horovod's response cache holds (0: no cache)."""
    value = os.environ.get("HOROVOD_CACHE_CAPACITY", str(HOROVOD_CACHE_CAPACITY))
    if not value.strip().isdigit():
        raise ValueError(f"HOROVOD_CACHE_CAPACITY: expected a whole number of tensors (0: no cache), got {value!r}")
    return int(value)


class HorovodAverage:
    """Averages the transfers of one graph with Horovod: each transfer as one grouped allreduce of
    its pieces, as long as the graph has handed Horovod no more tensors than its response cache
    holds; after that, as one allreduce per dtype of its pieces joined into one buffer.

    Grouped, Horovod copies the pieces into its fusion buffer, which it allocates once; joined
    here, every transfer allocates a buffer of its size in every step: BERT-base's gradients in
    25 transfers over 4 ranks on loopback cost 0.04-0.06 CPU seconds per step and rank and 90-130
    MB of peak RSS more joined, and on the emulated benches the largest rank's peak RSS went from
    1.21x Horovod's to 1.09x (BERT-base) and from 1.31x to 0.95x (ResNet-50) with grouping. But
    Horovod negotiates every tensor of a group, and caches the negotiation of at most
    HOROVOD_CACHE_CAPACITY tensors: beyond that, which the pieces of a few unrolled steps of a
    large model reach, each step's tensors would evict the last step's and every one would be
    negotiated in full, each step."""

    def __init__(self) -> None:
        self.cache_capacity = response_cache_capacity()
        self.tensors_handed = 0
        """Tensors this graph hands Horovod so far."""
        self.joining = False
        """Whether the cache was full: from then on the graph's transfers are joined."""

    def __call__(self, pieces: list[tf.Tensor], name: str) -> list[tf.Tensor]:
        cache_full = self.cache_capacity > 0 and self.tensors_handed + len(pieces) > self.cache_capacity
        if not (self.joining or cache_full):
            self.tensors_handed += len(pieces)
            return per_dtype(pieces, name, lambda group, group_name: list(hvd.grouped_allreduce(group, op=hvd.Average, name=group_name)))
        if not self.joining and hvd.rank() == 0:
            print(
                f"caramel: this step's graph hands Horovod more tensors than its response cache holds (HOROVOD_CACHE_CAPACITY "
                f"{self.cache_capacity}); its later transfers are joined into one buffer each, which costs a copy",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        self.joining = True
        self.tensors_handed += len({piece.dtype for piece in pieces})
        return average_per_dtype(pieces, name, lambda flat, flat_name: hvd.allreduce(flat, op=hvd.Average, name=flat_name))


@dataclass
class Chain:
    """The transfers already issued in the graph being traced, which later ones queue behind."""

    window: int = TRANSFERS_IN_FLIGHT
    last_inputs: list[tf.Tensor] = field(default_factory=list)
    """The pieces of the transfer issued last: the next may not be issued before they exist."""
    in_flight: deque[tf.Tensor] = field(default_factory=deque)
    """One output of each of the last `window` transfers."""

    def dependencies(self) -> list[tf.Tensor]:
        held_back = [self.in_flight[0]] if len(self.in_flight) == self.window else []
        return [*self.last_inputs, *held_back]

    def issued(self, inputs: list[tf.Tensor], outputs: list[tf.Tensor]) -> None:
        self.last_inputs = inputs
        self.in_flight.append(outputs[0])
        if len(self.in_flight) > self.window:
            self.in_flight.popleft()


@dataclass(frozen=True)
class IssuedTransfer:
    """A transfer in the graph: what exists once its inputs do, and once it is done."""

    ready: tf.Tensor
    done: tf.Tensor


def run_transfers(
    gradients: Sequence[tf.Tensor], transfers: Sequence[Transfer], chain: Chain, reduce: Reduce
) -> tuple[list[tf.Tensor], list[IssuedTransfer]]:
    """The averaged gradients, and each transfer's marks of readiness and completion."""
    lengths = [gradient.shape.num_elements() for gradient in gradients]
    pieces_of: list[list[tuple[int, tf.Tensor]]] = [[] for _ in gradients]
    issued = []
    for position, transfer in enumerate(transfers):
        # A whole tensor travels as it is; a chunk is a slice of the flattened tensor along its
        # only axis, which shares the tensor's buffer: chunking copies nothing.
        inputs = [
            gradients[p.tensor] if (p.start, p.stop) == (0, lengths[p.tensor]) else tf.reshape(gradients[p.tensor], [-1])[p.start : p.stop]
            for p in transfer.pieces
        ]
        with tf.control_dependencies(inputs):
            ready = tf.identity(inputs[0])  # the same buffer, once every input exists
        with tf.control_dependencies(chain.dependencies()):
            outputs = reduce(inputs, f"caramel_transfer_{position}")
        chain.issued(inputs, outputs)
        issued.append(IssuedTransfer(ready, outputs[0]))
        for piece, output in zip(transfer.pieces, outputs):
            pieces_of[piece.tensor].append((piece.start, output))
    averaged = [_joined(pieces, gradient.shape) for pieces, gradient in zip(pieces_of, gradients)]
    return averaged, issued


def run_split_transfers(
    gradients: Sequence[tf.Tensor], transfers: Sequence[Transfer], chain: Chain
) -> tuple[list[tf.Tensor], list[IssuedTransfer]]:
    """DeAR's decoupled all-reduce: each planned transfer reduce-scatters its pieces in plan
    order, as soon as they exist; once the step's last one is issued, the all-gathers follow,
    the transfer holding the parameter the next forward pass reads first going first. Each
    rank reduces a share of every piece, so a piece is cut along its flattened elements.
    A transfer counts as done when its all-gather is."""
    flat = [tf.reshape(gradient, [-1]) for gradient in gradients]
    shards = []
    for position, transfer in enumerate(transfers):
        inputs = [flat[p.tensor][p.start : p.stop] for p in transfer.pieces]
        with tf.control_dependencies(inputs):
            ready = tf.identity(inputs[0])
        with tf.control_dependencies(chain.dependencies()), tf.name_scope(f"caramel_reduce_{position}"):
            outputs = hvd.grouped_reducescatter(inputs, op=hvd.Average)
        chain.issued(inputs, outputs)
        shards.append((ready, outputs))
    pieces_of: list[list[tuple[int, tf.Tensor]]] = [[] for _ in gradients]
    done: list[tf.Tensor | None] = [None] * len(transfers)
    for position in sorted(range(len(transfers)), key=lambda i: min(p.tensor for p in transfers[i].pieces)):
        with tf.control_dependencies(chain.dependencies()):
            gathered = hvd.grouped_allgather(shards[position][1], name=f"caramel_gather_{position}")
        chain.issued(shards[position][1], gathered)
        done[position] = gathered[0]
        for piece, output in zip(transfers[position].pieces, gathered):
            pieces_of[piece.tensor].append((piece.start, output))
    averaged = [_joined(pieces, gradient.shape) for pieces, gradient in zip(pieces_of, gradients)]
    return averaged, [IssuedTransfer(ready, finished) for (ready, _), finished in zip(shards, done)]


def _joined(pieces: list[tuple[int, tf.Tensor]], shape: tf.TensorShape) -> tf.Tensor:
    """A gradient's averaged pieces, (start, piece) in any order, joined into its shape."""
    ordered = [piece for _, piece in sorted(pieces, key=lambda item: item[0])]
    return tf.reshape(ordered[0] if len(ordered) == 1 else tf.concat(ordered, axis=0), shape)
