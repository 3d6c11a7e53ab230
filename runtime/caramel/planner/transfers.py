"""The units of a transfer plan: pieces of flattened gradients, and the transfers that carry them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of the flattened gradient of tensor `tensor`."""

    tensor: int
    start: int
    stop: int


@dataclass(frozen=True)
class Transfer:
    """One collective operation: the pieces reduced together."""

    pieces: tuple[Piece, ...]
    nbytes: int
