"""Horovod's elastic Keras training (`hvd.elastic` of horovod.tensorflow.keras), served by Caramel:
`run` and the states of `horovod.tensorflow.elastic`, `KerasState`, and the callbacks that commit
the state and keep its batch and epoch (as Horovod 0.28.1's `horovod/_keras/elastic.py`).

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        model.fit(data, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=callbacks)
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from horovod.tensorflow.elastic import State, TensorFlowKerasState, run

__all__ = ["CommitStateCallback", "KerasState", "TensorFlowKerasState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer and Python objects given as keyword arguments."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a re-forming

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps `state.batch`, the batch of the epoch done last, and shortens a resumed epoch by it."""

    def __init__(self, state: Any) -> None:  # a State with the attribute this callback keeps (Horovod's contract)
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps `state.epoch`, the epochs done across re-formings (Keras counts each fit from 0)."""

    def __init__(self, state: Any) -> None:  # a State with the attribute this callback keeps (Horovod's contract)
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # Past this epoch: a re-forming after `state.batch` went back to 0 does not repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1
