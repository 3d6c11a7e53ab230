"""Local gradient accumulation: Horovod's `backward_passes_per_step` on DistributedOptimizer.

With N backward passes per step, Caramel does what Horovod does (its
horovod/tensorflow/gradient_aggregation*.py), so that a script gets Horovod's numbers:
- every pass adds its gradients to an accumulator per variable (sparse gradients as dense) and
  counts itself;
- the pass that brings the count to N sends the sums over the ranks, the only communication of
  the N passes, divides them by N where `average_aggregated_gradients`, and sets the
  accumulators to zero and the count to 0 (zeros assigned, not the sums subtracted: a sum that was
  not finite does not outlive its N passes); the optimizer's update is applied with them;
- the other passes apply nothing, but the optimizer's `iterations` advances, as on every pass
  of Horovod's: Keras' step count (and Caramel's, which is Keras') counts the passes.

In a graph the choices are `tf.cond`s on the count: TF ops, no Python per step, so one trace of
the step serves every pass, and copies of it (Caramel's graphs of several steps) share the count
and the accumulators, which tf.function orders from copy to copy as it orders any variable. The
count and the accumulators are variables made outside any trace: when the optimizer is built
(Caramel's Keras callback builds it before the first step), else where first needed, in
`tf.init_scope` as Keras makes its optimizers' slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

STATE = "_agg_helper"
"""The optimizer's attribute holding its Accumulation: Horovod's name (its tests read the count there)."""


class Accumulation:
    """One optimizer's accumulators and count of passes."""

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="caramel_accumulated_passes")
            """Passes accumulated since the last communication (Horovod's `counter`)."""
        self._sums: dict[int, tf.Variable] = {}
        """The accumulated gradient of each variable, by id."""

    def build(self, variables: Sequence[Any]) -> None:
        """An accumulator for each of `variables` that has none yet."""
        with tf.init_scope():
            for variable in variables:
                if id(variable) not in self._sums:
                    self._sums[id(variable)] = tf.Variable(
                        tf.zeros(variable.shape, variable.dtype), trainable=False, name="caramel_accumulated_gradient"
                    )

    def communicated(
        self, gradients: Sequence[Any], variables: Sequence[Any], reduce: Callable[[list[Any], list[Any]], list[Any]]
    ) -> list[Any]:
        """This pass's gradients added to the sums; on the Nth pass the sums `reduce`d over the ranks
        (divided by N where averaging) and the accumulators cleared; on the others the sums as
        they stand, which Horovod returns too. None gradients stay None."""
        self.build(variables)
        present = [index for index, gradient in enumerate(gradients) if gradient is not None]
        sums = []
        for index in present:
            accumulator = self._sums[id(variables[index])]
            accumulator.assign_add(tf.convert_to_tensor(gradients[index]))
            sums.append(accumulator.read_value())
        self.counter.assign_add(1)

        def communicate() -> list[tf.Tensor]:
            reduced = [tf.convert_to_tensor(gradient) for gradient in reduce(sums, [variables[index] for index in present])]
            if self.average:
                reduced = [gradient / self.passes for gradient in reduced]
            with tf.control_dependencies(reduced):
                for index in present:
                    accumulator = self._sums[id(variables[index])]
                    accumulator.assign(tf.zeros_like(accumulator))
                self.counter.assign(0)
                return [tf.identity(gradient) for gradient in reduced]

        result: list[Any] = list(gradients)
        if present:
            outputs = tf.cond(tf.equal(self.counter, self.passes), communicate, lambda: [tf.identity(total) for total in sums])
            for index, gradient in zip(present, tf.nest.flatten(outputs)):
                result[index] = gradient
        return result

    def applied(self, apply: Callable[[], Any], iterations: Any) -> None:
        """`apply()` (the optimizer's update) on the pass that communicated; on the others only the
        optimizer's `iterations` advances."""

        def update() -> tf.Tensor:
            apply()
            return tf.constant(True)

        def count() -> tf.Tensor:
            iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(tf.equal(self.counter, 0), update, count)


def accumulation(optimizer: Any, passes: int, average: bool) -> Accumulation:
    """`optimizer`'s Accumulation, made on first use. It is set past Keras' attribute tracking: the
    accumulators are not the optimizer's state to checkpoint or broadcast (Horovod's neither)."""
    state = optimizer.__dict__.get(STATE)
    if state is None:
        state = Accumulation(passes, average)
        object.__setattr__(optimizer, STATE, state)
    return state
