"""The planner on models nobody picked (testbed/shapes.py): what must hold for any model and link."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from caramel.contract.api import Scheduling
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import Batching, Ordering
from caramel.planner.schedule import (
    Batch,
    best_schedule,
    build_schedule,
    candidate_batches,
    deadlines,
    initial_plan,
    release_times,
    simulate,
)
from caramel.planner.search import plan_document, plan_from
from testbed.shapes import links, tensor_costs

# The search simulates every candidate batching: keep the examples few, the models many-shaped.
PLANNER_SETTINGS = settings(max_examples=15, deadline=None)


def covered_exactly_once(tensors, transfers) -> bool:
    seen: dict[int, list[tuple[int, int]]] = {}
    for transfer in transfers:
        if transfer.nbytes != sum((p.stop - p.start) * tensors[p.tensor].item_size for p in transfer.pieces):
            return False
        for piece in transfer.pieces:
            seen.setdefault(piece.tensor, []).append((piece.start, piece.stop))
    if sorted(seen) != list(range(len(tensors))):
        return False
    for index, ranges in seen.items():
        ranges.sort()
        if ranges[0][0] != 0 or ranges[-1][1] != tensors[index].nbytes // tensors[index].item_size:
            return False
        if any(a[1] != b[0] for a, b in zip(ranges, ranges[1:])):
            return False
    return True


@PLANNER_SETTINGS
@given(tensors=tensor_costs(), link=links(), ordering=st.sampled_from([Ordering.TIC, Ordering.ARRIVAL]))
def test_every_candidate_plan_sends_every_element_exactly_once_within_its_bucket(tensors, link, ordering) -> None:
    for batch in candidate_batches(tensors, Scheduling()):
        transfers = build_schedule(tensors, link, batch, ordering, Batching.AUTO)
        assert covered_exactly_once(tensors, transfers)
        assert all(t.nbytes <= batch.max_bytes or len(t.pieces) == 1 for t in transfers)


@PLANNER_SETTINGS
@given(tensors=tensor_costs(), link=links())
def test_no_prediction_beats_the_compute_or_the_link(tensors, link) -> None:
    plan = best_schedule(tensors, link, Scheduling())
    compute = sum(t.forward_seconds + t.backward_seconds for t in tensors)
    wire = sum(t.nbytes for t in tensors) * link.beta
    assert plan.predicted_step_seconds >= max(compute, wire) * (1 - 1e-9)


@PLANNER_SETTINGS
@given(tensors=tensor_costs(), link=links())
def test_the_chosen_plan_is_predicted_no_slower_than_sending_each_tensor_as_it_comes(tensors, link) -> None:
    # Horovod's own way, unfused: every tensor its own transfer, in backpropagation's order. The
    # search's candidates include bucket sizes at least that fine, so its pick is no slower,
    # within the tolerance it trades for fewer transfers.
    one_by_one = build_schedule(tensors, link, Batch(0, 1, 1, math.inf), Ordering.ARRIVAL, Batching.OFF)
    plan = best_schedule(tensors, link, Scheduling())
    assert plan.predicted_step_seconds <= simulate(tensors, one_by_one, link) * 1.02 + 1e-9


@PLANNER_SETTINGS
@given(tensors=tensor_costs(), link=links())
def test_plans_are_deterministic_and_travel_between_ranks_unchanged(tensors, link) -> None:
    plan = best_schedule(tensors, link, Scheduling())
    assert best_schedule(tensors, link, Scheduling()) == plan
    assert plan_from(plan_document(plan)) == plan


@settings(max_examples=50, deadline=None)
@given(tensors=tensor_costs())
def test_the_first_plan_sends_in_backpropagations_order(tensors) -> None:
    plan = initial_plan(tensors, Scheduling())
    order = [piece.tensor for transfer in plan.transfers for piece in transfer.pieces]
    assert order == sorted(order, reverse=True)
    assert covered_exactly_once(tensors, plan.transfers)


@settings(max_examples=50, deadline=None)
@given(tensors=tensor_costs())
def test_a_free_link_leaves_the_step_its_compute(tensors) -> None:
    released, needed = release_times(tensors), deadlines(tensors)
    forward = sum(t.forward_seconds for t in tensors)
    backward = sum(t.backward_seconds for t in tensors)
    assert all(forward <= r <= forward + backward + 1e-9 for r in released)
    assert all(0 <= n <= forward + 1e-9 for n in needed)
    # On a free link, tensors sent whole (a chunked one pays for its join) cost the step nothing.
    no_link = LinkModel(alpha=0.0, beta=0.0)
    whole = build_schedule(tensors, no_link, Batch(0, 2**62, 2**62), Ordering.TIC, Batching.AUTO)
    assert math.isclose(simulate(tensors, whole, no_link), forward + backward, rel_tol=1e-9, abs_tol=1e-12)
