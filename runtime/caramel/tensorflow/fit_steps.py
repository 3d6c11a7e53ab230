"""How many steps a Keras `fit` runs per graph under Caramel.

Caramel's gains need several steps in one graph (steps.py): `compile(steps_per_execution=N)` asks
for N, and most scripts, Horovod's examples among them, compile without it (1). Several steps per
graph change nothing a fit's user can observe (its losses, metrics, checkpoints and weights are
those of one step per graph) but for the callbacks that act on single batches: Keras calls their
batch hooks once per execution, not once per step. So where `compile` left 1, a fit runs
up to SEVERAL_STEPS per graph if no callback of it observes single batches, and keeps one step per
graph otherwise, naming the callback (`steps_for_fit`). The steps per graph divide the steps per
epoch, and the validation's where the fit gives them: Keras 3 counts an epoch's executions as whole
ones (it would end a finite dataset's last epoch early after a shorter one), and validates whole
executions (it would validate more batches than asked).

A callback observes single batches where its class or the instance overrides a batch hook of
Keras' Callback (`on_batch_begin`, `on_train_batch_end`, ...), unless what it does there is kept
to epochs by how it was made: Keras' ModelCheckpoint and BackupAndRestore with save_freq "epoch",
its TensorBoard with update_freq "epoch" and no profiling. A callback may also say so itself, with
an `observes_single_batches` attribute (Horovod's learning-rate schedules as Caramel serves them:
a staircase acts at an epoch's first batch only, which Keras' several steps per execution still
call). Caramel's own callbacks run the steps (keras.TrainingCallback) and are not asked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION

SEVERAL_STEPS = DEFAULT_STEPS_PER_EXECUTION
"""The steps per graph of a fit that `compile` left at one step and whose callbacks allow more."""
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end")
"""The hooks Keras calls per execution (per step only at one step per graph) in a fit: while it
trains, and while it validates (which runs as many steps per execution)."""


@dataclass(frozen=True)
class FitSteps:
    steps_per_execution: int
    """The steps per graph this fit runs."""
    why: str
    """For people: why so many (empty where `compile` asked for them)."""


def steps_for_fit(compiled: int, callbacks: Sequence[Any], steps_per_epoch: int | None, validation_steps: int | None = None) -> FitSteps:
    """The steps per graph of a fit that `compile` gave `compiled` steps per execution, with
    `callbacks` (Caramel's own left out), `steps_per_epoch` (None where not known before it) and
    `validation_steps` (where given): those asked for, or the most up to SEVERAL_STEPS that divide
    both where 1 was asked for and no callback observes single batches."""
    if compiled != 1:
        return FitSteps(compiled, "")
    observing = [callback for callback in callbacks if observes_single_batches(callback)]
    if observing:
        hooks = ", ".join(f"{type(callback).__name__}'s {'/'.join(overridden_hooks(callback))}" for callback in observing)
        return FitSteps(1, f"keeping one step per graph, as compiled: {hooks} act on single batches")
    if not steps_per_epoch:
        return FitSteps(1, "keeping one step per graph, as compiled: the steps per epoch are not known before fit")
    counts = [steps_per_epoch, *([validation_steps] if validation_steps else [])]
    steps = max(count for count in range(1, SEVERAL_STEPS + 1) if all(total % count == 0 for total in counts))
    if steps == 1:
        what = f"an epoch's {steps_per_epoch}" + (f" and the validation's {validation_steps}" if validation_steps else "")
        return FitSteps(1, f"keeping one step per graph, as compiled: no steps per graph from 2 to {SEVERAL_STEPS} divide {what}")
    return FitSteps(
        steps,
        f"{steps} steps per graph (compile gave steps_per_execution 1, and no callback of this fit acts on single "
        "batches): losses, metrics, checkpoints and weights are those of one step per graph",
    )


def epoch_steps(steps_per_epoch: int | None, x: Any, batch_size: int | None) -> int | None:
    """The steps of an epoch of a fit, as Keras counts them, where known before it: `fit`'s
    steps_per_epoch, or a finite tf.data.Dataset's length, or an array's batches."""
    if steps_per_epoch:
        return int(steps_per_epoch)
    if isinstance(x, tf.data.Dataset):
        length = int(x.cardinality().numpy())
        return length if length > 0 else None
    rows = getattr(x, "shape", None)
    if rows is not None and len(rows) > 0 and rows[0] is not None:
        return math.ceil(int(rows[0]) / (batch_size or 32))  # Keras' default batch size
    return None


def observes_single_batches(callback: Any) -> bool:
    """Whether a callback acts on single batches (see the module's docstring)."""
    said = getattr(callback, "observes_single_batches", None)
    if isinstance(said, bool):
        return said
    if not overridden_hooks(callback):
        return False
    if isinstance(callback, tf.keras.callbacks.ModelCheckpoint | tf.keras.callbacks.BackupAndRestore):
        return getattr(callback, "save_freq", None) != "epoch"
    if isinstance(callback, tf.keras.callbacks.TensorBoard):
        profiles = bool(getattr(callback, "_should_trace", False)) or bool(getattr(callback, "_start_batch", 0))
        return getattr(callback, "update_freq", None) != "epoch" or profiles or bool(getattr(callback, "write_steps_per_second", False))
    return True


def overridden_hooks(callback: Any) -> list[str]:
    """The batch hooks a callback's class or the callback itself (a LambdaCallback's) defines anew."""
    base = tf.keras.callbacks.Callback
    return [hook for hook in BATCH_HOOKS if hook in vars(callback) or getattr(type(callback), hook) is not getattr(base, hook)]
