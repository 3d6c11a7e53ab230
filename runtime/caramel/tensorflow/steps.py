"""Several training steps in one graph: the cross-iteration window for real training code.

Caramel's transfer boundaries let a parameter's transfer run until the next forward pass reads
it. A `tf.function` per step cannot give that: the function returns only once every transfer
is done. In one graph holding several steps, tf.function's automatic control dependencies
order the operations on each variable in program order and nothing else, so step k+1 reads a
parameter as soon as its own step-k update is applied, while the transfers of parameters
needed later go on. The steps are copies of one trace of the step (unrolled.py): a
`tf.while_loop`, which Keras' `steps_per_execution` uses, finishes every operation of an
iteration before the next begins.

Until the first plan made from measurements, executions run one step each (the cheapest graph
to build), on the plan, which stamps when the gradients exist. Between executions the
replanner may adopt a new plan; the step is then traced once more and its executions built
again, and the selector measures the new plan against Horovod's own way before it keeps one.
Every rank runs the same executions, so every rank re-plans at the same step. What adopting a
plan cost (its first execution's time beyond an ordinary execution's) goes back to the
replanner, which adopts a later plan only if its gain repays that within the steps left.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from caramel.planner.timing import StepTimes
from caramel.tensorflow.process import communicator
from caramel.planner.rounds import block_steps
from caramel.tensorflow.communicator import ARMS_NAME
from caramel.tensorflow.unrolled import TracedStep

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
        plan's gain against its rebuild."""
        self.completed_steps = 0
        self.last_times: list[StepTimes] = []
        """Timings of the steps of the last call (empty when they ran Horovod's own way or
        communicated eagerly)."""
        self._traced: TracedStep | None = None
        self._executions: dict[int, Callable[[Iterator[Any]], list[Any]]] = {}
        functools.update_wrapper(self, step)

    def __call__(self, iterator: Iterator[Any], steps: int | None = None) -> list[Any]:
        """Run the next `steps` steps (at most steps_per_execution; default that many)."""
        count = self.steps_per_execution if steps is None else steps
        if not 1 <= count <= self.steps_per_execution:
            raise ValueError(f"steps must be between 1 and steps_per_execution ({self.steps_per_execution}), got {count}")
        gradient_communicator = communicator()
        replanner = gradient_communicator.replanner
        steps_left = None if self.total_steps is None else max(0, self.total_steps - self.completed_steps)
        # No search while the selector measures: a new plan would restart its round.
        replanned = replanner.at_boundary(self.completed_steps, steps_left, may_search=not gradient_communicator.selector.exploring)
        if replanner.communicated:
            gradient_communicator.selector.untime_last_step()  # the re-plan's time is neither arm's
        if replanned:
            self._traced, self._executions = None, {}  # traced and built for the old plan
            # The first execution of the new graphs builds them: it is not measured.
            gradient_communicator.selector.set_block(block_steps(self.steps_per_execution))
            gradient_communicator.selector.start_round(settle=self.steps_per_execution)
            if hvd.rank() == 0:
                print(f"caramel: from step {self.completed_steps + 1}, {replanner.describe()}", file=sys.stderr, flush=True)
        started, built = time.perf_counter(), len(self._executions)
        if replanner.measured:
            outputs = self._execute(iterator, count)
        else:
            # Until a plan was made from measurements, one step per execution: its graph is the
            # cheapest to build, and the first measured plan is made at the next boundary.
            # A single step that built nothing gives the step time the first measured plan's
            # re-plan interval is weighed against: without it the next re-plan would come after
            # replanIntervalSteps whatever it costs, and its search, in a process of its own,
            # would take CPU from the steps when they are short of it.
            outputs, times = [], []
            for _ in range(count):
                single_started, single_built = time.perf_counter(), len(self._executions)
                outputs += self._execute(iterator, 1)
                if len(self._executions) == single_built:
                    replanner.seconds_per_step = time.perf_counter() - single_started
                times += self.last_times
            self.last_times = times
        seconds = time.perf_counter() - started
        if len(self._executions) == built:
            replanner.seconds_per_step = seconds / count
        elif replanned and replanner.seconds_per_step is not None:
            replanner.retrace_seconds = max(0.0, seconds - count * replanner.seconds_per_step)
        return outputs

    def _execute(self, iterator: Iterator[Any], count: int) -> list[Any]:
        if count not in self._executions:
            self._executions[count] = self._build(iterator, count)
        try:
            outputs = self._executions[count](iterator)
        except tf.errors.OutOfRangeError:
            raise RuntimeError(
                f"the data ran out within an execution of {count} steps: give the iterator at least as many batches as steps"
            ) from None
        self.completed_steps += count
        self.last_times = communicator().measure(count)
        return outputs

    def _build(self, iterator: Iterator[Any], count: int) -> Callable[[Iterator[Any]], list[Any]]:
        """An execution of `count` steps with the plan in force: copies of the step, traced once
        per plan."""
        gradient_communicator = communicator()
        if self._traced is None:
            with gradient_communicator.tracing_steps():
                self._traced = TracedStep(self._one_step, iterator.element_spec)
            self._traced.bypass_identity_n(ARMS_NAME)
        # Each step keeps its stamps in a variable of its own, and only the first stamps releases.
        per_slot = [(gradient_communicator.stamp_store(i), gradient_communicator.stamp_releases(i)) for i in range(count)]
        first_store, first_flag = per_slot[0]

        def captures(index: int) -> Mapping[int, tf.Tensor]:
            store, flag = per_slot[index]
            return {id(first_store.handle): store.handle, id(first_flag.handle): flag.handle}

        return self._traced.copies(count, captures)

    def _one_step(self, batch: Any) -> Any:
        return self.step(*batch) if self.unpack and isinstance(batch, tuple) else self.step(batch)


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
    faster plan only if it repays its rebuild before the end.
    """
    if step is None:
        return lambda wrapped: StepFunction(wrapped, steps_per_execution, total_steps=total_steps)
    return StepFunction(step, steps_per_execution, total_steps=total_steps)
