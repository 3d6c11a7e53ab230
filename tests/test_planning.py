"""Transfer plans: every gradient element travels exactly once, in the chosen order and sizes."""

from __future__ import annotations

import pytest

from caramel.api import Scheduling, Tuning
from caramel.planning import bucket_limit, plan_transfers, transfer_order

COUNTS = [10, 2000, 5, 300, 1]  # elements per tensor, in forward order
ITEM = [4] * len(COUNTS)


def covered(plan):
    seen = {}
    for transfer in plan:
        assert transfer.nbytes == sum((p.stop - p.start) * 4 for p in transfer.pieces)
        for piece in transfer.pieces:
            seen.setdefault(piece.tensor, []).append((piece.start, piece.stop))
    return seen


def assert_exact_cover(plan):
    for tensor, ranges in covered(plan).items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == COUNTS[tensor]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert set(covered(plan)) == set(range(len(COUNTS)))


def test_off_sends_each_tensor_alone_in_forward_order():
    plan = plan_transfers(COUNTS, ITEM, Scheduling(batching="off"), limit=64)
    assert [t.pieces[0].tensor for t in plan] == [0, 1, 2, 3, 4]
    assert all(len(t.pieces) == 1 for t in plan)


def test_arrival_order_is_backpropagation_order():
    assert transfer_order(4, Scheduling(ordering="arrival").ordering) == [3, 2, 1, 0]
    assert transfer_order(4, Scheduling(ordering="tic").ordering) == [0, 1, 2, 3]


@pytest.mark.parametrize("limit", [4, 64, 1000, 4000, 10**6])
def test_buckets_respect_the_limit_and_cover_everything(limit):
    plan = plan_transfers(COUNTS, ITEM, Scheduling(batching="fixed"), limit)
    assert all(t.nbytes <= limit for t in plan)
    assert_exact_cover(plan)


def test_large_tensor_is_pipelined_in_chunks():
    plan = plan_transfers([1000], [4], Scheduling(batching="fixed"), limit=1200)
    assert [(p.start, p.stop) for t in plan for p in t.pieces] == [(0, 300), (300, 600), (600, 900), (900, 1000)]


def test_auto_packs_everything_into_the_fewest_buckets():
    scheduling = Scheduling()
    plan = plan_transfers(COUNTS, ITEM, scheduling, bucket_limit(scheduling, None))
    assert len(plan) == 1 and plan[0].nbytes == sum(COUNTS) * 4


def test_auto_starts_from_tuned_bucket_bytes_within_the_bounds():
    scheduling = Scheduling(minBucketBytes=1000, maxBucketBytes=10_000)
    assert bucket_limit(scheduling, Tuning(bucketBytes=5000)) == 5000
    assert bucket_limit(scheduling, Tuning(bucketBytes=10)) == 1000
    assert bucket_limit(scheduling, Tuning(bucketBytes=10**9)) == 10_000
    assert bucket_limit(Scheduling(batching="fixed", minBucketBytes=1000, maxBucketBytes=10_000), Tuning(bucketBytes=5000)) == 10_000
