"""Step timings from the stamps a step's graph takes: pure functions, no TensorFlow."""

from __future__ import annotations

import pytest

from caramel.planner.timing import StepStamps, execution_times, typical_backward_seconds
from caramel.planner.transfers import Piece, Transfer

# Three gradients; transfer 0 carries tensor 2 (released first), transfer 1 tensors 1 and 0.
PLAN = (
    Transfer((Piece(2, 0, 100),), 400),
    Transfer((Piece(1, 0, 50), Piece(0, 0, 25)), 300),
)


def test_transfers_are_timed_from_when_they_could_start():
    # Execution starts at 0; gradients 2, 1, 0 at 1.0, 1.2, 1.5: transfer 0 is ready at 1.0 and
    # ends at 1.3, transfer 1 is ready at 1.5 and ends at 1.9.
    (times,) = execution_times([StepStamps(0.0, (1.0, 1.5), (1.3, 1.9), releases=(1.5, 1.2, 1.0))], PLAN)
    assert [t.seconds for t in times.transfers] == pytest.approx([0.3, 0.4])
    assert [t.nbytes for t in times.transfers] == [400, 300] and times.nbytes == 700
    assert times.communication_seconds == pytest.approx(0.7)
    # Gradient 2's backward pass: of the 1.0 s before it existed, what the forward pass (half of
    # the whole backward pass, its own included) left: 0.5 s.
    assert times.backward_seconds == pytest.approx((0.3, 0.2, 0.5))
    # The link waited 1.0 s for the first transfer's gradient and 0.2 s for the second's (1.3 -> 1.5).
    assert times.transfer_wait_seconds == pytest.approx(1.2)
    # One step, the last of its execution: waited after backprop for transfer 1 (1.5 -> 1.9).
    assert times.exposed_seconds == pytest.approx(0.4)


def test_a_transfer_queued_behind_another_counts_from_that_ones_end():
    (times,) = execution_times([StepStamps(0.0, (1.0, 1.0), (2.0, 2.5))], PLAN)
    assert [t.seconds for t in times.transfers] == pytest.approx([1.0, 0.5])
    assert times.backward_seconds is None  # releases are stamped in an execution's first step only


def test_later_steps_of_an_execution_expose_only_their_waits_for_parameters():
    steps = [
        StepStamps(0.0, (1.0, 1.5), (1.3, 1.9)),  # forward span 1.0: cannot have waited
        StepStamps(0.0, (2.7, 3.2), (3.0, 3.5)),  # starts at 1.5, first transfer ready at 2.7: span 1.2
    ]
    first, second = execution_times(steps, PLAN)
    assert first.exposed_seconds == pytest.approx(0.0)  # its tail overlapped the next step
    assert second.exposed_seconds == pytest.approx(0.2 + 0.3)  # waited 0.2, then its tail 3.2 -> 3.5


def test_stamps_must_match_the_plan():
    with pytest.raises(ValueError, match="3 and 3 transfer stamps for a plan of 2 transfers"):
        execution_times([StepStamps(0.0, (1.0, 1.0, 1.0), (1.1, 1.2, 1.3))], PLAN)


def test_typical_backward_times_ignore_one_slow_step_and_unstamped_ones():
    steps = execution_times(
        [StepStamps(0.0, (1.0, 1.5), (1.3, 1.9), (1.5, 1.2, 1.0)), StepStamps(0.0, (4.0, 4.5), (4.3, 4.9), (4.5, 4.2, 4.0)),
         StepStamps(0.0, (7.0, 9.9), (7.3, 9.95), (9.9, 7.2, 7.0)), StepStamps(0.0, (10.0, 10.1), (10.2, 10.3))],
        PLAN,
    )  # fmt: skip
    assert typical_backward_seconds(steps) == pytest.approx([0.3, 0.2, 0.0])
    assert typical_backward_seconds(steps[3:]) is None
