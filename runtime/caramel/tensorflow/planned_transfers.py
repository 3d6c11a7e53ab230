"""The planned transfers of a step, as the backend's collectives inside the step's graph.

Each planned transfer is one fused all-reduce of its pieces (slices of flattened gradients).
Collectives in a graph start as soon as their inputs exist, and only data or control
dependencies order them. The plan's order is kept with control dependencies: a transfer is
issued no earlier than the gradients of the transfer before it exist, and at most `window`
transfers are in flight (issued and not finished), so that when one ends the next is already
queued and no thread hand-over sits on the link's path. Each step's transfers start a chain of
their own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tensorflow as tf

from caramel.collectives.backend import Backend
from caramel.planner.transfers import Transfer

# Collectives in flight at once: with two, the next transfer is already queued when the current
# one ends.
TRANSFERS_IN_FLIGHT = 2

Reduce = Callable[[list[tf.Tensor], str], list[tf.Tensor]]
"""Averages a transfer's pieces over all ranks in the graph: (pieces, name) -> averages."""


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


def run_transfers(gradients: Sequence[tf.Tensor], transfers: Sequence[Transfer], chain: Chain, reduce: Reduce) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """The averaged gradients, and an output of each transfer, which exists once it is done."""
    lengths = [gradient.shape.num_elements() for gradient in gradients]
    pieces_of: list[list[tuple[int, tf.Tensor]]] = [[] for _ in gradients]
    done = []
    for position, transfer in enumerate(transfers):
        # A whole tensor travels as it is; a chunk is a slice of the flattened tensor along its
        # only axis, which shares the tensor's buffer: chunking copies nothing.
        inputs = [
            gradients[p.tensor] if (p.start, p.stop) == (0, lengths[p.tensor]) else tf.reshape(gradients[p.tensor], [-1])[p.start : p.stop]
            for p in transfer.pieces
        ]
        # Named by its place in the plan, on every backend (tests read the graph by these names).
        with tf.control_dependencies(chain.dependencies()), tf.name_scope(f"caramel_transfer_{position}"):
            outputs = reduce(inputs, f"caramel_transfer_{position}")
        chain.issued(inputs, outputs)
        done.append(outputs[0])
        for piece, output in zip(transfer.pieces, outputs):
            pieces_of[piece.tensor].append((piece.start, output))
    averaged = [_joined(pieces, gradient.shape) for pieces, gradient in zip(pieces_of, gradients)]
    return averaged, done


def run_split_transfers(
    gradients: Sequence[tf.Tensor], transfers: Sequence[Transfer], chain: Chain, backend: Backend
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """DeAR's decoupled all-reduce: each planned transfer reduce-scatters its pieces in plan
    order, as soon as they exist; once the step's last one is issued, the all-gathers follow,
    the transfer holding the parameter the next forward pass reads first going first. Each
    rank reduces a share of every piece, so a piece is cut along its flattened elements.
    A transfer is done when its all-gather is."""
    flat = [tf.reshape(gradient, [-1]) for gradient in gradients]
    shards = []
    for transfer in transfers:
        inputs = [flat[p.tensor][p.start : p.stop] for p in transfer.pieces]
        with tf.control_dependencies(chain.dependencies()):
            outputs = backend.reduce_scatter(inputs)  # type: ignore[attr-defined]  # Horovod's only: see GradientCommunicator
        chain.issued(inputs, outputs)
        shards.append(outputs)
    pieces_of: list[list[tuple[int, tf.Tensor]]] = [[] for _ in gradients]
    done: list[tf.Tensor | None] = [None] * len(transfers)
    for position in sorted(range(len(transfers)), key=lambda i: min(p.tensor for p in transfers[i].pieces)):
        with tf.control_dependencies(chain.dependencies()):
            gathered = backend.gather_shards(shards[position], name=f"caramel_gather_{position}")  # type: ignore[attr-defined]
        chain.issued(shards[position], gathered)
        done[position] = gathered[0]
        for piece, output in zip(transfers[position].pieces, gathered):
            pieces_of[piece.tensor].append((piece.start, output))
    averaged = [_joined(pieces, gradient.shape) for pieces, gradient in zip(pieces_of, gradients)]
    return averaged, done


def _joined(pieces: list[tuple[int, tf.Tensor]], shape: tf.TensorShape) -> tf.Tensor:
    """A gradient's averaged pieces, (start, piece) in any order, joined into its shape."""
    ordered = [piece for _, piece in sorted(pieces, key=lambda item: item[0])]
    return tf.reshape(ordered[0] if len(ordered) == 1 else tf.concat(ordered, axis=0), shape)
