"""Which way a step's gradients travel, chosen inside the graph by measured step time.

Every step's graph holds two ways (arms) to average its gradients: the backend's own
(`Backend.own_way`: exactly as `hvd.DistributedGradientTape`, or MultiWorkerMirroredStrategy,
does it) and the plan in force (`planned_transfers.py`). A prediction can be wrong; a measurement of both
on this job, this model and this link cannot be wrong in the same way. So the graph measures
both and keeps the faster: Caramel is then never slower than the backend's own way by more than what
the measuring costs, whatever its planner predicted.

Each step ticks the selector once, when all of its gradients exist (backpropagation's end, a
point of every step that no transfer holds up): the time since the last tick is that step's
duration, and the tick chooses the next step's arm, which that step's branch reads from a
variable. The arm is then known before the step's first gradient exists: a branch index that
came from a tick on the step's own first gradient held every step back, measurably
(benchmarks/results/2026-11-25-selector-index.txt). A round of measurement runs:
- `settle` steps on the plan, unmeasured (the first round: until the graph runs at its pace and
  the replanner has the plan's stamps; after a new plan: its first steps);
- then blocks of `block` steps, the own way's and the plan's in turn, BLOCK_PAIRS of each (ABAB, so a
  drift of the machine hits both alike; `caramel.planner.rounds`); the first step of a block is
  not measured, as it may still carry the other arm's transfers;
- then every rank takes rank 0's choice (one broadcast of one number): the arm with the lower
  mean step, the plan only if it measured faster by more than MIN_GAIN;
- then the chosen arm runs, for `exploit` steps or until rank 0's step time drifts by more than
  DRIFT from what it measured (the link changed; checked every DRIFT_CHECK_BLOCKS blocks, and
  broadcast), and a new round starts, without settling.
Everything above is a handful of scalar ops per step in the graph: no Python on the step's path.
Caramel's multi-step executions reset it from Python, between executions, when they adopt a new
plan. Every rank ticks the same steps, so every rank switches at the same step. Blocks are whole executions (`block` a multiple of the steps per execution), so that each
arm's measured steps carry the same share of execution boundaries.
"""

from __future__ import annotations

import tensorflow as tf

from caramel.collectives.backend import Backend
from caramel.planner.rounds import BLOCK_PAIRS, MIN_BLOCK_STEPS
from caramel.tensorflow.devices import HOST

OWN_WAY, PLANNED = 0, 1
"""The arms: the backend's own way, and the plan in force."""
ARMS = ("own", "planned")
UNTIMED, EXPLORED, EXPLOITED = 0, 1, 2
"""How a step's time counts: not at all, towards its arm's mean, towards the chosen arm's drift."""
# The plan is chosen only if it measured this much faster: closer than this, noise decides, and
# the backend's own way is the safe side.
MIN_GAIN = 0.01
# An exploited arm whose step time moves this far from what it measured has met a changed link
# or load: measure both again.
DRIFT = 0.25
# Weight of the newest step in the exploited arm's running mean, which is compared for DRIFT.
DRIFT_SMOOTHING = 0.2
# The chosen arm is compared for DRIFT every this many blocks.
DRIFT_CHECK_BLOCKS = 4
DEFAULT_SETTLE_STEPS = 4
# Steps of the chosen arm between rounds (unless it drifts first).
DEFAULT_EXPLOIT_STEPS = 200


class ArmSelector:
    """The arm each step runs, measured and chosen in the graph (see the module's docstring)."""

    def __init__(
        self, backend: Backend, block: int = MIN_BLOCK_STEPS, settle: int = DEFAULT_SETTLE_STEPS, exploit: int = DEFAULT_EXPLOIT_STEPS
    ) -> None:
        self._backend = backend
        with tf.init_scope(), tf.device(HOST):
            variable = lambda value, dtype, name: tf.Variable(value, dtype=dtype, trainable=False, name=f"caramel_selector_{name}")  # noqa: E731
            self.steps = variable(0, tf.int64, "steps")
            """Steps ticked so far."""
            self.round_start = variable(0, tf.int64, "round_start")
            self.settle = variable(settle, tf.int64, "settle")
            self.block = variable(block, tf.int64, "block")
            self.exploit = variable(exploit, tf.int64, "exploit")
            self.last_time = variable(-1.0, tf.float64, "last_time")
            self.arm = variable(PLANNED, tf.int32, "arm")
            """The arm of the step under way (chosen by the last tick, read by the step's
            switch); at the next tick, the arm that step's time counts for."""
            self.last_kind = variable(UNTIMED, tf.int32, "last_kind")
            """How the last step's time counts: UNTIMED, EXPLORED or EXPLOITED."""
            self.seconds = variable(tf.zeros([2], tf.float64), tf.float64, "seconds")
            self.counts = variable(tf.zeros([2], tf.float64), tf.float64, "counts")
            self.chosen = variable(OWN_WAY, tf.int32, "chosen")
            self.chosen_mean = variable(0.0, tf.float64, "chosen_mean")
            """The chosen arm's measured mean step; its running mean since is `recent`."""
            self.recent = variable(0.0, tf.float64, "recent")
            self.decisions = variable(0, tf.int64, "decisions")
            self.means = variable(tf.zeros([2], tf.float64), tf.float64, "means")
            """Each arm's mean step in the last round measured."""
        self._decisions_seen = 0

        @tf.function(autograph=False)
        def tick(anchor: tf.Tensor, at: tf.Tensor) -> tf.Tensor:
            with tf.device(HOST):
                with tf.control_dependencies([anchor]):
                    now = tf.where(at >= 0.0, at, tf.timestamp())
                return self._tick(now)

        self._tick_function = tick

    def tick(self, anchor: tf.Tensor, at: float = -1.0) -> tf.Tensor:
        """Ends the step under way once `anchor` exists, and returns the arm (an int32 scalar)
        of the next step, also left in `arm`; `at`, where given (tests), is the tick's time in
        seconds instead."""
        return self._tick_function(anchor, tf.constant(at, tf.float64))

    def _tick(self, now: tf.Tensor) -> tf.Tensor:
        steps, round_start, block = self.steps.read_value(), self.round_start.read_value(), self.block.read_value()
        settle, exploit = self.settle.read_value(), self.exploit.read_value()
        # What the last step took goes to its arm if it was an explored step, or to the running
        # mean of the chosen arm if it was an exploited one.
        last_time, last_kind = self.last_time.read_value(), self.last_kind.read_value()
        elapsed = now - last_time
        timed = last_time >= 0.0
        explored = tf.logical_and(timed, tf.equal(last_kind, EXPLORED))
        one_hot = tf.one_hot(self.arm.read_value(), 2, dtype=tf.float64) * tf.cast(explored, tf.float64)
        seconds = self.seconds.read_value() + one_hot * elapsed
        counts = self.counts.read_value() + one_hot
        exploited = tf.logical_and(timed, tf.equal(last_kind, EXPLOITED))
        recent = self.recent.read_value()
        recent = tf.where(exploited, (1.0 - DRIFT_SMOOTHING) * recent + DRIFT_SMOOTHING * elapsed, recent)
        # Where the next step stands in its round.
        exploring = steps + 1 - round_start - settle
        explore_steps = 2 * BLOCK_PAIRS * block
        in_blocks = tf.logical_and(exploring >= 0, exploring < explore_steps)
        block_arm = tf.cast(tf.math.floordiv(tf.maximum(exploring, 0), block) % 2, tf.int32)  # the own way's first
        deciding = tf.equal(exploring, explore_steps)
        chosen = tf.cond(deciding, lambda: self._decision(seconds, counts), self.chosen.read_value)
        chosen_mean = tf.where(deciding, tf.gather(tf.math.divide_no_nan(seconds, counts), chosen), self.chosen_mean.read_value())
        recent = tf.where(deciding, chosen_mean, recent)
        # A new round, without settling, at a block boundary, once the chosen arm ran long
        # enough or drifted.
        exploiting = exploring > explore_steps
        # Each rank times its own steps, so only rank 0's drift counts, broadcast to every rank:
        # ranks that restarted at different steps would run different arms and wait on each
        # other's collectives forever. Checked every DRIFT_CHECK_BLOCKS blocks, which bounds the
        # broadcasts' cost on short steps.
        check_drift = tf.logical_and(exploiting, tf.equal(tf.math.floormod(exploring, DRIFT_CHECK_BLOCKS * block), 0))
        drifted = tf.cond(
            check_drift, lambda: self._agreed(tf.abs(recent - chosen_mean) > DRIFT * chosen_mean, "caramel_arm_drift"), lambda: tf.constant(False)
        )  # fmt: skip
        due = tf.logical_and(tf.equal(tf.math.floormod(exploring, block), 0), exploring >= explore_steps + exploit)
        restart = tf.logical_and(exploiting, tf.logical_or(due, drifted))
        arm = tf.where(exploring < 0, PLANNED, tf.where(in_blocks, block_arm, chosen))
        arm = tf.where(restart, OWN_WAY, arm)
        # The first step of a block (a restart opens one) may still carry the other arm's transfers.
        opens_block = tf.logical_or(restart, tf.equal(tf.math.floormod(tf.maximum(exploring, 0), block), 0))
        kind = tf.where(
            tf.logical_and(in_blocks, tf.logical_not(opens_block)), EXPLORED,
            tf.where(tf.logical_and(exploring >= explore_steps, tf.logical_not(restart)), EXPLOITED, UNTIMED),
        )  # fmt: skip
        fresh = tf.logical_or(restart, deciding)
        updates = [
            self.steps.assign(steps + 1),
            self.round_start.assign(tf.where(restart, steps + 1, round_start)),
            self.settle.assign(tf.where(restart, tf.zeros_like(settle), settle)),
            self.last_time.assign(now),
            self.arm.assign(arm),
            self.last_kind.assign(kind),
            self.seconds.assign(tf.where(fresh, tf.zeros_like(seconds), seconds)),
            self.counts.assign(tf.where(fresh, tf.zeros_like(counts), counts)),
            self.chosen.assign(chosen),
            self.chosen_mean.assign(chosen_mean),
            self.recent.assign(recent),
            self.decisions.assign_add(tf.cast(deciding, tf.int64)),
            self.means.assign(tf.where(deciding, tf.math.divide_no_nan(seconds, counts), self.means.read_value())),
        ]
        with tf.control_dependencies(updates):
            return tf.identity(arm)

    def start_round(self, settle: int) -> None:
        """Eagerly, between executions on every rank: measure both arms again from the next step,
        after `settle` steps of the plan (a new plan was adopted)."""
        self.round_start.assign(self.steps)
        self.arm.assign(PLANNED if settle > 0 else OWN_WAY)  # the next step's, as a tick would choose
        self.settle.assign(settle)
        self.seconds.assign(tf.zeros([2], tf.float64))
        self.counts.assign(tf.zeros([2], tf.float64))
        self.last_kind.assign(UNTIMED)

    def untime_last_step(self) -> None:
        """Eagerly: the step under way (its time runs from the last tick to the next) takes
        longer for something neither arm does, such as a re-plan between executions: its time
        counts for nothing."""
        self.last_kind.assign(UNTIMED)

    def set_block(self, steps: int) -> None:
        """Eagerly: blocks of this many steps (a multiple of the steps per execution)."""
        self.block.assign(steps)

    @property
    def exploring(self) -> bool:
        """Eagerly: whether a round is under way (settling or measuring), not yet decided."""
        position = int(self.steps.numpy()) - int(self.round_start.numpy())  # of the step under way
        return position < int(self.settle.numpy()) + 2 * BLOCK_PAIRS * int(self.block.numpy())

    @property
    def planned(self) -> bool:
        """Eagerly: whether the steps run the plan (False before any step was ticked)."""
        return int(self.steps.numpy()) > 0 and int(self.arm.numpy()) == PLANNED

    def new_decision(self) -> str | None:
        """Eagerly: the last round's outcome, for people, if a round ended since the last call."""
        decisions = int(self.decisions.numpy())
        if decisions == self._decisions_seen:
            return None
        self._decisions_seen = decisions
        own, planned = (float(mean) * 1e3 for mean in self.means.numpy())
        own_way = self._backend.own_way_name
        chosen = "the plan" if int(self.chosen.numpy()) == PLANNED else own_way
        return f"steps run {chosen}: measured {planned:.4g} ms per step with the plan, {own:.4g} ms with {own_way}"

    def _agreed(self, condition: tf.Tensor, name: str) -> tf.Tensor:
        """Rank 0's value of a boolean, on every rank."""
        return tf.cast(self._backend.broadcast([tf.cast(condition, tf.int32)], root_rank=0, name=name)[0], tf.bool)

    def _decision(self, seconds: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
        """Rank 0's choice, on every rank: the plan if it measured faster by more than MIN_GAIN."""
        mean = tf.math.divide_no_nan(seconds, counts)
        planned_faster = tf.logical_and(counts[PLANNED] > 0, mean[PLANNED] < (1.0 - MIN_GAIN) * mean[OWN_WAY])
        choice = tf.where(tf.logical_and(counts[OWN_WAY] > 0, planned_faster), PLANNED, OWN_WAY)
        return tf.cast(self._backend.broadcast([choice], root_rank=0, name="caramel_arm_choice")[0], tf.int32)
