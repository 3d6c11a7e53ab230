"""The arm selector (`caramel.tensorflow.selector`): which way each step's gradients travel,
measured and chosen in the graph. Driven here with given tick times, on one rank (its
choice is broadcast from rank 0)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from caramel.planner.rounds import BLOCK_PAIRS, block_steps, explore_steps, first_decision_step
from caramel.tensorflow.selector import DRIFT, DRIFT_CHECK_BLOCKS, MIN_GAIN, OWN_WAY, PLANNED, ArmSelector

BLOCK, SETTLE = 4, 4
DECISION = SETTLE + 2 * BLOCK_PAIRS * BLOCK  # the step (0-based) that decides


class Clock:
    """Runs steps against a selector in a graph, as the communicator does: each step runs the arm
    the last tick chose, takes the time that arm costs, and ticks as it ends."""

    def __init__(self, selector: ArmSelector, seconds: dict[int, float]) -> None:
        self.selector, self.seconds, self.now = selector, seconds, 100.0
        self.arms: list[int] = []
        self._tick = tf.function(lambda at: selector.tick(tf.constant(0.0), at))

    def run(self, steps: int) -> list[int]:
        arms = []
        for _ in range(steps):
            arm = int(self.selector.arm.numpy())
            arms.append(arm)
            self.now += self.seconds[arm]
            assert int(self._tick(self.now)) == int(self.selector.arm.numpy())  # the next step's arm
        self.arms += arms
        return arms


def blocks(*arms: int) -> list[int]:
    return [arm for arm in arms for _ in range(BLOCK)]


def test_a_round_settles_on_the_plan_then_measures_the_own_way_and_the_plan_in_turn(one_rank) -> None:
    clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE), {OWN_WAY: 1.0, PLANNED: 0.8})
    assert clock.run(DECISION) == [PLANNED] * SETTLE + blocks(OWN_WAY, PLANNED, OWN_WAY, PLANNED)
    assert clock.run(10) == [PLANNED] * 10  # measured faster: kept
    horovod_mean, planned_mean = clock.selector.means.numpy()
    assert (horovod_mean, planned_mean) == pytest.approx((1.0, 0.8))
    assert clock.selector.new_decision() == "steps run the plan: measured 800 ms per step with the plan, 1000 ms with TensorFlow's collectives in buckets as the gradients come"
    assert clock.selector.new_decision() is None  # said once


def test_a_plan_that_measured_slower_or_barely_faster_is_not_kept(one_rank) -> None:
    for planned_seconds in (1.2, 1.0 - MIN_GAIN / 2):
        clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE), {OWN_WAY: 1.0, PLANNED: planned_seconds})
        clock.run(DECISION)
        assert clock.run(5) == [OWN_WAY] * 5
        assert not clock.selector.planned


def test_the_first_step_of_every_block_is_not_measured(one_rank) -> None:
    # Each block's first step costs ten times more: were it measured, the own way would win.
    selector = ArmSelector(one_rank, block=BLOCK, settle=SETTLE)
    tick = tf.function(lambda at: selector.tick(tf.constant(0.0), at))
    now, arms = 0.0, []
    for step in range(DECISION + 1):
        arms.append(int(selector.arm.numpy()))
        first_of_block = step >= SETTLE and (step - SETTLE) % BLOCK == 0 and step < DECISION
        now += (10.0 if first_of_block and arms[-1] == PLANNED else 1.0) * (0.9 if arms[-1] == PLANNED else 1.0)
        tick(now)
    assert arms[-1] == PLANNED


def test_a_step_untimed_between_executions_counts_for_nothing(one_rank) -> None:
    clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE), {OWN_WAY: 1.0, PLANNED: 0.9})
    clock.run(SETTLE + BLOCK + 2)  # into the plan's first block
    clock.selector.untime_last_step()
    clock.now += 100.0  # a re-plan between executions: neither arm's doing
    clock.run(DECISION - SETTLE - BLOCK - 2)
    assert clock.run(1) == [PLANNED]


def test_a_drifting_step_time_measures_both_again_at_the_next_check(one_rank) -> None:
    clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE, exploit=1000), {OWN_WAY: 1.0, PLANNED: 0.8})
    clock.run(DECISION + 3)
    assert clock.selector.decisions.numpy() == 1
    clock.seconds = {OWN_WAY: 1.0, PLANNED: 0.8 * (1 + 3 * DRIFT)}  # the link changed
    arms = clock.run(DRIFT_CHECK_BLOCKS * BLOCK + explore_steps(BLOCK))
    assert OWN_WAY in arms  # measuring again, without settling
    assert clock.selector.decisions.numpy() == 2 and not clock.selector.planned


def test_rounds_come_back_after_the_exploited_steps(one_rank) -> None:
    exploit = 3 * BLOCK
    clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE, exploit=exploit), {OWN_WAY: 1.0, PLANNED: 0.8})
    clock.run(DECISION + exploit + explore_steps(BLOCK) + BLOCK + 1)
    assert clock.selector.decisions.numpy() == 2


def test_a_new_round_settles_for_the_steps_asked_then_measures_from_the_own_way(one_rank) -> None:
    clock = Clock(ArmSelector(one_rank, block=BLOCK, settle=SETTLE), {OWN_WAY: 1.0, PLANNED: 0.8})
    clock.run(DECISION + 5)
    clock.selector.start_round(settle=8)
    assert clock.selector.exploring
    assert clock.run(8 + BLOCK) == [PLANNED] * 8 + [OWN_WAY] * BLOCK


@pytest.mark.parametrize(("steps_per_execution", "block", "first_decision"), [(1, 4, 18), (4, 4, 24), (8, 8, 48), (3, 6, 30)])
def test_blocks_are_whole_executions_of_at_least_four_steps(steps_per_execution: int, block: int, first_decision: int) -> None:
    assert block_steps(steps_per_execution) == block
    assert first_decision_step(steps_per_execution) == first_decision
