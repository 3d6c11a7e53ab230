"""Planning gradient transfers: which tensors travel together, in which order.

Pure functions over tensor sizes, so that the plan is the same on every rank (all ranks see the
same model) and can be tested without TensorFlow or a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caramel.api import Batching, Ordering, Scheduling, Tuning


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


def transfer_order(tensor_count: int, ordering: Ordering) -> list[int]:
    """Tensor indices in sending order; tensors are indexed in the order the forward pass reads them.

    tic (and auto, until measured layer times feed the tac ordering) sends first what the next
    forward pass needs first. arrival sends in the order backpropagation produces gradients,
    last layer first, which is what Horovod does.
    """
    forward = list(range(tensor_count))
    return forward[::-1] if ordering is Ordering.ARRIVAL else forward


def bucket_limit(scheduling: Scheduling, tuning: Tuning | None) -> int:
    """The largest transfer to form: a tuned size within the spec's bounds, else maxBucketBytes.

    While every gradient is handed over at once, the fewest, largest buckets minimise the
    per-transfer latency paid, which is why auto starts from maxBucketBytes.
    """
    if scheduling.batching is Batching.AUTO and tuning is not None:
        return max(scheduling.min_bucket_bytes, min(scheduling.max_bucket_bytes, tuning.bucket_bytes))
    return scheduling.max_bucket_bytes


def plan_transfers(
    element_counts: Sequence[int], item_sizes: Sequence[int], scheduling: Scheduling, limit: int
) -> list[Transfer]:
    """Group gradients into transfers of at most `limit` bytes, in sending order.

    batching off sends every tensor alone. fixed and auto pack consecutive tensors into
    buckets; a tensor bigger than the limit is cut into chunks, so that its reduction is
    pipelined instead of needing one huge buffer.
    """
    if len(element_counts) != len(item_sizes):
        raise ValueError("element_counts and item_sizes differ in length")
    order = transfer_order(len(element_counts), scheduling.ordering)
    if scheduling.batching is Batching.OFF:
        return [
            Transfer((Piece(i, 0, element_counts[i]),), element_counts[i] * item_sizes[i]) for i in order
        ]

    transfers: list[Transfer] = []
    bucket: list[Piece] = []
    bucket_bytes = 0
    for index in order:
        count, item_size = element_counts[index], item_sizes[index]
        chunk_elements = max(1, limit // item_size)
        for start in range(0, max(count, 1), chunk_elements):
            stop = min(count, start + chunk_elements)
            piece_bytes = (stop - start) * item_size
            if bucket and bucket_bytes + piece_bytes > limit:
                transfers.append(Transfer(tuple(bucket), bucket_bytes))
                bucket, bucket_bytes = [], 0
            bucket.append(Piece(index, start, stop))
            bucket_bytes += piece_bytes
    if bucket:
        transfers.append(Transfer(tuple(bucket), bucket_bytes))
    return transfers
