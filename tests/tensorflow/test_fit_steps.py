"""Which fits run several steps per graph: those `compile` left at one step whose callbacks do
not act on single batches, by the hooks each overrides and how it was made (fit_steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from caramel.tensorflow.fit_steps import SEVERAL_STEPS, epoch_steps, observes_single_batches, steps_for_fit


class EpochLogger(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class BatchCounter(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


class SaysSo(BatchCounter):
    observes_single_batches = False


def test_a_fit_compiled_with_its_steps_per_execution_runs_them() -> None:
    assert steps_for_fit(8, [BatchCounter()], 10).steps_per_execution == 8


def test_a_fit_compiled_at_one_step_runs_several_where_no_callback_acts_on_single_batches() -> None:
    callbacks = [
        EpochLogger(), tf.keras.callbacks.EarlyStopping(), tf.keras.callbacks.History(), tf.keras.callbacks.CSVLogger("log.csv"),
        tf.keras.callbacks.ModelCheckpoint("model.keras"), tf.keras.callbacks.TensorBoard("logs"),
        tf.keras.callbacks.LearningRateScheduler(lambda epoch: 0.1), tf.keras.callbacks.LambdaCallback(on_epoch_end=print), SaysSo(),
    ]  # fmt: skip
    chosen = steps_for_fit(1, callbacks, 100)
    assert chosen.steps_per_execution == SEVERAL_STEPS and "no callback of this fit acts on single batches" in chosen.why


@pytest.mark.parametrize(
    "callback",
    [
        BatchCounter(),
        tf.keras.callbacks.TerminateOnNaN(),
        tf.keras.callbacks.ModelCheckpoint("model.keras", save_freq=10),
        tf.keras.callbacks.TensorBoard("logs", update_freq="batch"),
        tf.keras.callbacks.LambdaCallback(on_batch_end=print),
    ],
    ids=["own-hook", "terminate-on-nan", "checkpoint-every-10", "tensorboard-per-batch", "lambda-per-batch"],
)
def test_one_callback_that_acts_on_single_batches_keeps_one_step_per_graph_naming_it(callback) -> None:
    assert observes_single_batches(callback)
    chosen = steps_for_fit(1, [EpochLogger(), callback], 100)
    assert chosen.steps_per_execution == 1
    assert f"{type(callback).__name__}'s " in chosen.why and "act on single batches" in chosen.why


@pytest.mark.parametrize(("steps_per_epoch", "steps"), [(100, 4), (6, 3), (10, 2), (7, 1), (None, 1)])
def test_the_steps_per_graph_divide_an_epoch(steps_per_epoch, steps) -> None:
    chosen = steps_for_fit(1, [EpochLogger()], steps_per_epoch)
    assert chosen.steps_per_execution == steps and chosen.why


def test_an_epochs_steps_are_fits_or_its_datas() -> None:
    assert epoch_steps(5, None, None) == 5
    assert epoch_steps(None, tf.data.Dataset.range(12).batch(4), None) == 3
    assert epoch_steps(None, tf.data.Dataset.range(12).repeat(), None) is None
    assert epoch_steps(None, np.zeros((100, 3)), 32) == 4 and epoch_steps(None, np.zeros((64, 3)), None) == 2


@pytest.mark.parametrize(("validation_steps", "steps"), [(None, 4), (8, 4), (6, 2), (5, 1)])
def test_the_steps_per_graph_divide_the_validation_too(validation_steps, steps) -> None:
    assert steps_for_fit(1, [EpochLogger()], 100, validation_steps).steps_per_execution == steps
