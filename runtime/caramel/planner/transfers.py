"""The units of a transfer plan: pieces of flattened gradients, and the transfers that carry them.

A sequence of transfers also travels as a flat list of integers (`encode`, `decode`), so that one
rank can plan and broadcast the result to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def encode(transfers: Sequence[Transfer]) -> list[int]:
    """[transfers, then per transfer: its bytes, its pieces, then (tensor, start, stop) per piece]."""
    values = [len(transfers)]
    for transfer in transfers:
        values += [transfer.nbytes, len(transfer.pieces)]
        for piece in transfer.pieces:
            values += [piece.tensor, piece.start, piece.stop]
    return values


def decode(values: Sequence[int]) -> tuple[Transfer, ...]:
    """The transfers `encode` gave these values for."""
    numbers = iter(int(value) for value in values)
    transfers = []
    for _ in range(next(numbers)):
        nbytes, count = next(numbers), next(numbers)
        transfers.append(Transfer(tuple(Piece(next(numbers), next(numbers), next(numbers)) for _ in range(count)), nbytes))
    return tuple(transfers)
