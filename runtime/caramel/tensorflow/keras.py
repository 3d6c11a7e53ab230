"""Keras `model.fit` as a Caramel job: one callback does what the job needs.

    model.compile(optimizer=ctf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss=...,
                  steps_per_execution=4)
    caramel = TrainingCallback(model)
    model.fit(data, epochs=5, steps_per_epoch=100, initial_epoch=caramel.initial_epoch,
              callbacks=[caramel], verbose=0)

The callback reads the steps and epochs from what `fit` tells every callback (`self.params`) and
- runs before the other callbacks of the fit, whatever its place in the list, so that no callback
  reads weights before every rank has rank 0's; and where `compile` left one step per execution
  and no other callback of the fit acts on single batches, the fit runs several steps per graph
  (`caramel.tensorflow.fit_steps`, which says why, once, either way);
- restores the latest checkpoint on rank 0 (when the job has `spec.checkpoint`) and broadcasts
  every weight and optimizer variable from rank 0, so all ranks start identical (Horovod's
  BroadcastGlobalVariablesCallback); `initial_epoch` is the epoch to resume at, which the
  checkpoint keeps;
- runs Keras' own `train_step` through `caramel.tensorflow.function`: the `steps_per_execution`
  given to `compile` are unrolled in one graph (Keras' own loop finishes every step before the
  next starts), so each step's transfers overlap the next forward pass, and the transfer plan
  is re-made between executions as the link is measured;
- records Caramel's per-step metrics and logs progress lines from rank 0;
- checkpoints at the end of every epoch once `spec.checkpoint.intervalSteps` steps have passed
  since the last one, and at the end: Keras resumes at epoch boundaries only;
- at the end, checks that every rank holds the same weights.

It works on either Keras `tf.keras` may be (Keras 3, or Keras 2 where the job sets
TF_USE_LEGACY_KERAS=1: `caramel.tensorflow.keras_version`).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from caramel.planner.timing import StepTimes
from caramel.tensorflow.fit_steps import epoch_steps, steps_for_fit
from caramel.tensorflow.keras_version import running_steps_per_execution, steps_per_execution
from caramel.tensorflow.ledger import Ledger
from caramel.tensorflow.runtime import Runtime, current
from caramel.tensorflow.steps import StepFunction

BATCH_SIZE = "caramel_batch_size"
"""The output by which Caramel's step tells the callback its batch's size (taken out of the logs)."""
_FIT_HOOKED = "_caramel_fit"


class TrainingCallback(tf.keras.callbacks.Callback):
    """Broadcast, scheduling, metrics, progress, checkpoints and resume for `model.fit`.

    With `checkpoints=False` it leaves checkpoints and resume to the script (Horovod's callbacks,
    as Caramel serves them, are this callback so). `local_variables` are variables each rank
    keeps its own: not broadcast, and left out of the check that every rank ends with the same
    weights (Horovod's BroadcastGlobalVariablesCallback's).

    A model that Keras builds in its first step (a Sequential without an input shape, a subclassed
    model) has no variables to broadcast before it: its first execution runs as Keras' own step,
    its gradients averaged by the DistributedOptimizer, and rank 0's variables are broadcast after
    it, as Horovod's callback broadcasts after the first batch; Caramel's steps run the rest. Its
    ranks then hold the same weights from the second execution on, as under Horovod. Such a model
    cannot resume from the job's checkpoint (spec.checkpoint): restoring needs its variables
    before the first step."""

    def __init__(self, model: tf.keras.Model | None = None, *, checkpoints: bool = True, local_variables: Sequence[Any] = ()) -> None:
        super().__init__()
        _hook_fit()
        self._runtime: Runtime = current()
        self._checkpoints = checkpoints
        self._local_variables = {id(variable): variable for variable in local_variables}
        self._runtime.local_variables.update(self._local_variables)
        self._ledger: Ledger | None = None
        self._steps: StepFunction | None = None
        self._execution: tuple[float, list[Any]] = (0.0, [])
        self._next_step = 0
        """The epoch's step (0-based) the next execution starts at."""
        if model is not None and model.built:
            self._start(model)

    @property
    def _restores(self) -> bool:
        """Whether the callback restores the job's checkpoint before fit."""
        return self._checkpoints and self._runtime.contract.checkpoint is not None

    @property
    def initial_epoch(self) -> int:
        """The epoch to pass to `fit` as initial_epoch: the one after the restored checkpoint's (0
        without one)."""
        if self._ledger is None:
            if self._restores:
                raise RuntimeError("TrainingCallback(model) restores before fit: give it the built, compiled model to know initial_epoch")
            return 0
        return int(self._ledger.epochs.numpy())

    @property
    def _training(self) -> tuple[Ledger, StepFunction]:
        """The ledger and the step function of the fit under way (`on_train_begin` makes them)."""
        if self._ledger is None or self._steps is None:
            raise RuntimeError("TrainingCallback's training hooks are Keras fit's: they run only after on_train_begin")
        return self._ledger, self._steps

    def _start(self, model: tf.keras.Model) -> Ledger:
        """Restore (rank 0) and broadcast: the model is built and compiled."""
        if model.optimizer is None:
            raise ValueError("compile the model (with ctf.DistributedOptimizer) before TrainingCallback(model)")
        # Keras counts the steps done in the optimizer's iterations, which checkpoints keep.
        self._ledger = Ledger(
            self._runtime, model, model.optimizer, model.optimizer.iterations, total_steps=0, batch_size=None,
            checkpoints=self._checkpoints, local_variables=self._local_variables,
        )  # fmt: skip
        return self._ledger

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.params.get("steps"):
            raise ValueError(
                "Caramel runs a known number of steps per epoch: pass steps_per_epoch to fit, or a dataset whose length is known"
            )
        if self._ledger is None and not self.model.built:
            if self._restores:
                raise ValueError(
                    "TrainingCallback restores the job's checkpoint (spec.checkpoint) before the first step, and this model has no "
                    "variables before it: give its first layer an input shape (or call model.build) before fit"
                )
            return  # its first execution runs as Keras' own; on_train_batch_end sets up the rest
        self._take_over()

    def _take_over(self) -> None:
        """From the next execution on, Caramel's steps run the training, every rank starting from
        rank 0's variables."""
        ledger = self._ledger or self._start(self.model)
        ledger.total_steps = self.params["steps"] * self.params["epochs"]
        self._steps = StepFunction(
            self._keras_step, steps_per_execution(self.model), unpack=False,
            total_steps=ledger.total_steps - ledger.completed_steps,
        )  # fmt: skip
        self.model.train_function = self._train_function

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._next_step = 0

    def _keras_step(self, data: Any) -> Any:
        """Keras' own training step, and the size of its batch."""
        outputs = dict(self.model.train_step(data))
        outputs[BATCH_SIZE] = tf.shape(tf.nest.flatten(data)[0])[0]
        return outputs

    def _train_function(self, iterator: Any) -> Any:
        """What `fit` calls per execution: the steps Keras asks for, several per graph."""
        count = min(steps_per_execution(self.model), self.params["steps"] - self._next_step)
        self._next_step += count
        started = time.perf_counter()
        outputs = self._training[1](iterator, count)
        self._execution = ((time.perf_counter() - started) / count, outputs)
        return {name: value for name, value in outputs[-1].items() if name != BATCH_SIZE}

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._steps is None:  # Keras' own first execution built the model (see the class's docstring)
            self._take_over()
            self._next_step = batch + 1
            return
        seconds, outputs = self._execution
        ledger, steps = self._training
        times: Sequence[StepTimes | None] = steps.last_times or [None] * len(outputs)
        if ledger.global_batch is None and outputs:
            ledger.global_batch = int(outputs[0][BATCH_SIZE]) * self._runtime.size
        losses = [float(output["loss"]) if "loss" in output else float("nan") for output in outputs]
        ledger.record_steps(ledger.completed_steps - len(outputs) + 1, seconds, losses, times)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        ledger = self._training[0]
        ledger.epochs.assign(epoch + 1)
        ledger.checkpoint_if_due()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._training[0].finish()


def _hook_fit() -> None:
    """From the first TrainingCallback made on, every `fit` given one runs it (or them) before its
    other callbacks, and as many steps per graph as `steps_for_fit` decides for those others,
    saying why once per reason; `compile`'s steps per execution are the model's again after."""
    original = tf.keras.Model.fit
    if getattr(original, _FIT_HOOKED, False):
        return
    signature = inspect.signature(original)
    said: set[str] = set()

    @functools.wraps(original)
    def fit(self: tf.keras.Model, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments.get("callbacks")
        listed = list(given) if isinstance(given, list | tuple) else []
        caramel = [callback for callback in listed if isinstance(callback, TrainingCallback)]
        if not caramel:
            return original(*bound.args, **bound.kwargs)
        others = [callback for callback in listed if not isinstance(callback, TrainingCallback)]
        bound.arguments["callbacks"] = [*caramel, *others]
        arguments = bound.arguments
        steps = epoch_steps(arguments.get("steps_per_epoch"), arguments.get("x"), arguments.get("batch_size"))
        chosen = steps_for_fit(steps_per_execution(self), others, steps, arguments.get("validation_steps"))
        if chosen.why and chosen.why not in said:
            said.add(chosen.why)
            current().say(chosen.why)
        with running_steps_per_execution(self, chosen.steps_per_execution):
            return original(*bound.args, **bound.kwargs)

    setattr(fit, _FIT_HOOKED, True)
    tf.keras.Model.fit = fit
