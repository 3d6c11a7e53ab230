"""Several training steps in one graph: the cross-iteration window for real training code.

Caramel's transfer boundaries let a parameter's transfer run until the next forward pass reads
it. A `tf.function` per step cannot give that: the function returns only once every transfer
is done. In one graph holding several steps, tf.function's automatic control dependencies
order the operations on each variable in program order and nothing else, so step k+1 reads a
parameter as soon as its own step-k update is applied, while the transfers of parameters
needed later go on. The steps are unrolled (a Python loop at trace time): a `tf.while_loop`,
which Keras' `steps_per_execution` uses, finishes every operation of an iteration before the
next begins.

Between executions the replanner may adopt a new plan; the graphs of the old one are then
traced again. Every rank runs the same executions, so every rank re-plans at the same step.
What a re-trace cost (its execution's time beyond an ordinary execution's) goes back to the
replanner, which adopts a later plan only if its gain repays that within the steps left.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.planner.timing import StepTimes
from caramel.tensorflow.process import communicator

DEFAULT_STEPS_PER_EXECUTION = 4


class StepFunction:
    """A training step, run up to `steps_per_execution` times in one graph per call.

    `step` is an ordinary training step (forward pass, Caramel's tape or optimizer, update)
    taking one batch: with `unpack` a tuple from the iterator is passed as positional
    arguments, anything else (and everything without `unpack`) as one argument. Calling the
    StepFunction with an iterator (of a `tf.data.Dataset`) runs the next steps and returns
    each step's outputs, in order.
    """

    def __init__(
        self,
        step: Callable[..., Any],
        steps_per_execution: int = DEFAULT_STEPS_PER_EXECUTION,
        *,
        unpack: bool = True,
        total_steps: int | None = None,
    ) -> None:
        if steps_per_execution < 1:
            raise ValueError(f"steps_per_execution must be at least 1, got {steps_per_execution}")
        if total_steps is not None and total_steps < 0:
            raise ValueError(f"total_steps must not be negative, got {total_steps}")
        self.step = step
        self.unpack = unpack
        self.steps_per_execution = steps_per_execution
        self.total_steps = total_steps
        """How many steps this function will run in all, where known: the steps left weigh a new
        plan's gain against its re-trace."""
        self.completed_steps = 0
        self.last_times: list[StepTimes] = []
        """Timings of the steps of the last call (empty when the step communicated eagerly)."""
        self._graphs: dict[int, Callable[[Iterator[Any]], list[Any]]] = {}
        functools.update_wrapper(self, step)

    def __call__(self, iterator: Iterator[Any], steps: int | None = None) -> list[Any]:
        """Run the next `steps` steps (at most steps_per_execution; default that many)."""
        count = self.steps_per_execution if steps is None else steps
        if not 1 <= count <= self.steps_per_execution:
            raise ValueError(f"steps must be between 1 and steps_per_execution ({self.steps_per_execution}), got {count}")
        gradient_communicator = communicator()
        replanner = gradient_communicator.replanner
        gradient_communicator.cycle.at_boundary(replanner.seconds_per_step)
        steps_left = None if self.total_steps is None else max(0, self.total_steps - self.completed_steps)
        replanned = replanner.at_boundary(self.completed_steps, steps_left)
        if replanned:
            self._graphs.clear()  # traced for the old plan
            if hvd.rank() == 0:
                print(f"caramel: from step {self.completed_steps + 1}, {replanner.describe()}", file=sys.stderr, flush=True)
        started, graphs = time.perf_counter(), len(self._graphs)
        if replanner.measured:
            outputs = self._execute(iterator, count)
        else:
            # Until a plan was made from measurements, one step per execution: its graph is cheap
            # to trace, and the first measured plan is made at the next boundary.
            outputs, times = [], []
            for _ in range(count):
                outputs += self._execute(iterator, 1)
                times += self.last_times
            self.last_times = times
        seconds = time.perf_counter() - started
        if len(self._graphs) == graphs:
            replanner.seconds_per_step = seconds / count
        elif replanned and replanner.seconds_per_step is not None:
            replanner.retrace_seconds = max(0.0, seconds - count * replanner.seconds_per_step)
        return outputs

    def _execute(self, iterator: Iterator[Any], count: int) -> list[Any]:
        if count not in self._graphs:
            communicator().prepare(count)
            self._graphs[count] = tf.function(functools.partial(self._steps, count))
        try:
            outputs = self._graphs[count](iterator)
        except tf.errors.OutOfRangeError:
            raise RuntimeError(
                f"the data ran out within an execution of {count} steps: give the iterator at least as many batches as steps"
            ) from None
        self.completed_steps += count
        self.last_times = communicator().measure(count)
        return outputs

    def _steps(self, count: int, iterator: Iterator[Any]) -> list[Any]:
        outputs = []
        for _ in range(count):
            batch = next(iterator)
            outputs.append(self.step(*batch) if self.unpack and isinstance(batch, tuple) else self.step(batch))
        return outputs


def function(
    step: Callable[..., Any] | None = None,
    *,
    steps_per_execution: int = DEFAULT_STEPS_PER_EXECUTION,
    total_steps: int | None = None,
) -> StepFunction | Callable[[Callable[..., Any]], StepFunction]:
    """Run a training step several times per graph execution; usable as a decorator.

        @ctf.function(steps_per_execution=4, total_steps=1000)
        def train_step(features, labels):
            ...
        losses = train_step(iterator)     # the next 4 steps' losses

    `total_steps`, if given, is how many steps the loop will run: re-planning then adopts a
    faster plan only if it repays its re-trace before the end.
    """
    if step is None:
        return lambda wrapped: StepFunction(wrapped, steps_per_execution, total_steps=total_steps)
    return StepFunction(step, steps_per_execution, total_steps=total_steps)
