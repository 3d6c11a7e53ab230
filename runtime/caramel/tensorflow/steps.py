"""Several training steps in one graph: the cross-iteration window for real training code.

Caramel's transfer boundaries let a parameter's transfer run until the next forward pass reads
it. A `tf.function` per step cannot give that: the function returns only once every transfer
is done. In one graph holding several steps, tf.function's automatic control dependencies
order the operations on each variable in program order and nothing else, so step k+1 reads a
parameter as soon as its own step-k update is applied, while the transfers of parameters
needed later go on. The steps are copies of one trace of the step (unrolled.py): a
`tf.while_loop`, which Keras' `steps_per_execution` uses, finishes every operation of an
iteration before the next begins.

Until the first plan made from measurements, the steps run exactly as the backend's own API
runs them: the step in a `tf.function` of one step, called once per step, its gradients sent the
backend's own way (Horovod's tape's, each transfer waiting for its own gradients only), with the
moment each gradient exists stamped beside them, for the replanner, which searches the first
plan from those releases beside the steps. A graph of several steps costs several times what
the own graph cost to build (its copies, TensorFlow's optimization of the larger graph and its
first run), which a short training cannot win back: the steps go on to Caramel's graph of
several steps, with the plan found, only if its predicted gain over the own graph's step
repays that build within the steps left (the replanner); otherwise the own graph runs on,
its stamps switched off, and a short job costs what the backend's own API costs. Steps run one
per graph (`steps_per_execution` 1) run the own graph alone: no order of the transfers has a
window to gain in there. Between executions the replanner may
adopt a new plan; the step is then traced once more and its executions built again, and the
selector measures the new plan against the backend's own way before it keeps one. Every rank runs
the same executions, so every rank re-plans at the same step. What adopting a plan cost (its
first execution's time beyond an ordinary execution's) goes back to the replanner, which adopts
a later plan only if its gain repays that within the steps left. Once the selector has chosen,
blocks of this graph and of the backend's own graph of one step run in turn, and the one measured
faster runs on (graph_choice.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import tensorflow as tf

from caramel.planner.timing import StepTimes
from caramel.tensorflow.communicator import ARMS_NAME, GradientCommunicator
from caramel.tensorflow.graph_choice import OWN_GRAPH
from caramel.tensorflow.runtime import current
from caramel.tensorflow.step_optimization import optimizes_once
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
        """Timings of the steps of the last call (empty when they ran the backend's own way or
        communicated eagerly)."""
        self._traced: TracedStep | None = None
        self._executions: dict[int, Callable[[Iterator[Any]], list[Any]]] = {}
        self._own_step: Callable[[Any], Any] | None = None
        """The step as the backend's own API runs it: a tf.function of one step (see graph_choice.py)."""
        self._own_first_call_seconds: float | None = None
        """What the own graph's first call cost: tracing the step, TensorFlow's optimization of
        its graph, and the step."""
        self._caramels_graph_failed = False
        """Caramel's graph could not be built for this step: the own graph runs from then on."""
        functools.update_wrapper(self, step)

    @property
    def _communicator(self) -> GradientCommunicator:
        """The process's (a step function may be made before `caramel.tensorflow.init()`)."""
        return current().communicator

    def __call__(self, iterator: Iterator[Any], steps: int | None = None) -> list[Any]:
        """Run the next `steps` steps (at most steps_per_execution; default that many)."""
        count = self.steps_per_execution if steps is None else steps
        if not 1 <= count <= self.steps_per_execution:
            raise ValueError(f"steps must be between 1 and steps_per_execution ({self.steps_per_execution}), got {count}")
        control = self._communicator.control
        steps_left = None if self.total_steps is None else max(0, self.total_steps - self.completed_steps)
        execution = control.at_boundary(
            self.completed_steps, steps_left, self.steps_per_execution, count, self._own_first_call_seconds, self._caramels_graph_failed
        )
        if execution.retrace:
            self._traced, self._executions = None, {}  # traced and built for the old plan
        if execution.graph == OWN_GRAPH:
            outputs, timed_steps, timed_seconds = self._run_own_steps(iterator, count)
            seconds = timed_seconds
        else:
            started, built = time.perf_counter(), len(self._executions)
            outputs = self._execute(iterator, count)
            seconds = time.perf_counter() - started
            timed_steps, timed_seconds = (count, seconds) if len(self._executions) == built else (0, 0.0)
        control.executed(execution, self.completed_steps, count, timed_steps, timed_seconds, seconds)
        return outputs

    def _run_own_steps(self, iterator: Iterator[Any], count: int) -> tuple[list[Any], int, float]:
        """`count` steps of the backend's own graph, one call each; and how many of them built
        nothing, and their seconds (each timed to its loss, as a loop over it would). Until the
        first plan is decided, each step stamps its gradients' releases beside its transfers,
        which the replanner plans from."""
        gradient_communicator = self._communicator
        outputs, timed_steps, timed_seconds = [], 0, 0.0
        for _ in range(count):
            built = self._own_step is None
            own_step = self._own_step = self._own_step or tf.function(self._one_step)
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise _data_ran_out(count) from None
            with gradient_communicator.tracing_own_graph():  # where the call traces the step
                outputs.append(own_step(batch))  # returns once the step has run
            seconds = time.perf_counter() - started
            if gradient_communicator.control.wants_releases:
                gradient_communicator.measure_own_step()
            if built:
                self._own_first_call_seconds = seconds
            else:
                timed_steps, timed_seconds = timed_steps + 1, timed_seconds + seconds
        self.completed_steps += count
        self.last_times = []
        return outputs, timed_steps, timed_seconds

    def _execute(self, iterator: Iterator[Any], count: int) -> list[Any]:
        if count not in self._executions:
            try:
                self._executions[count] = self._build(iterator, count)
            except Exception as error:  # noqa: BLE001 (any failure to build it: the step itself runs as the own graph)
                return self._fall_back(iterator, count, error)
        try:
            outputs = self._executions[count](iterator)
        except tf.errors.OutOfRangeError:
            raise _data_ran_out(count) from None
        self.completed_steps += count
        self.last_times = self._communicator.measure(count)
        return outputs

    def _fall_back(self, iterator: Iterator[Any], count: int, error: Exception) -> list[Any]:
        """Caramel's graph for the plan in force could not be built: say so once, naming the plan,
        and run the steps, these and all later ones, as the backend's own graph."""
        self._caramels_graph_failed = True
        self._traced, self._executions = None, {}
        current().say(
            f"{self._communicator.control.describe_plan()} could not be built into the step's graph ({type(error).__name__}: {error}); "
            "the steps run the backend's own way from here on"
        )
        return self._run_own_steps(iterator, count)[0]

    def _build(self, iterator: Iterator[Any], count: int) -> Callable[[Iterator[Any]], list[Any]]:
        """An execution of `count` steps with the plan in force: copies of the step, traced once
        per plan."""
        gradient_communicator = self._communicator
        if self._traced is None:
            with gradient_communicator.tracing_steps():
                self._traced = TracedStep(self._one_step, iterator.element_spec)  # type: ignore[attr-defined]  # a tf.data iterator's
            self._traced.bypass_identity_n(ARMS_NAME)
            if optimizes_once():
                try:
                    self._traced.optimize()
                except Exception as error:  # noqa: BLE001 (grappler's refusal of one graph: TensorFlow optimizes the copies instead)
                    current().say(
                        f"the step could not be optimized on its own ({type(error).__name__}: {error}); TensorFlow optimizes "
                        "the graph of several steps instead, which takes longer to build"
                    )
        # Each copy of the step reads its own slot's variables where the trace read the first's.
        per_slot = [gradient_communicator.slot_variables(i) for i in range(count)]

        def captures(index: int) -> Mapping[int, tf.Tensor]:
            return {id(first.handle): own.handle for first, own in zip(per_slot[0], per_slot[index])}

        return self._traced.copies(count, captures)

    def _one_step(self, batch: Any) -> Any:
        return self.step(*batch) if self.unpack and isinstance(batch, tuple) else self.step(batch)


def _data_ran_out(count: int) -> RuntimeError:
    return RuntimeError(f"the data ran out within an execution of {count} steps: give the iterator at least as many batches as steps")


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
