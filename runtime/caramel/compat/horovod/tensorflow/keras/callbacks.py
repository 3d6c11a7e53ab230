"""Horovod's Keras callbacks (`hvd.callbacks`), served by Caramel.

- `BroadcastGlobalVariablesCallback(root_rank, local_variables=...)` is Caramel's
  `TrainingCallback` without checkpoints (a Horovod script makes its own): root_rank's variables
  on every rank when training begins (but the local variables, each rank's own), or after the
  first batch for a model Keras builds in it (as Horovod broadcasts), Keras' step in Caramel's
  graphs, metrics, progress, and the weights check at the end. Caramel's callbacks run before the
  others of a `fit` (whatever their place in the list), so that no callback reads weights before
  every rank has the root's, and a fit compiled at one step per execution runs several per graph
  where no other callback acts on single batches (`caramel.tensorflow.fit_steps`).
- `MetricAverageCallback()` averages the epoch's logs over the ranks at the end of every epoch
  (put it before the callbacks that read them, as with Horovod).
- `LearningRateScheduleCallback` and `LearningRateWarmupCallback` set the learning rate as
  Horovod's do: `initial_lr * multiplier(epoch)` at the start of each epoch (staircase) or of each
  batch (epoch + batch / steps_per_epoch) between start_epoch and end_epoch, the warm-up going from
  initial_lr / size to initial_lr over warmup_epochs, with the momentum correction of Goyal et
  al. (Horovod scales the momentum coefficient by new_lr / old_lr for the batch; a Keras
  optimizer's coefficient is a constant of its compiled step, so the momentum slots are scaled
  instead, which is the same update for SGD and RMSprop).

They are callbacks of the Keras `tf.keras` is (Keras 3, or Keras 2 where the job sets
TF_USE_LEGACY_KERAS=1), as are the models they serve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

import horovod.tensorflow as hvd
from caramel.collectives.backend import ReduceOp
from caramel.tensorflow.keras import TrainingCallback
from caramel.tensorflow.keras_version import optimizer_state
from caramel.tensorflow.ledger import Ledger
from horovod._caramel_support import refuse
from horovod.tensorflow import _caramel_final_check
from horovod.tensorflow._caramel_collectives import backend, check_root

class BroadcastGlobalVariablesCallback(TrainingCallback):
    """Rank root_rank's variables on every rank when training begins (after the first batch, for
    a model Keras builds in it), and Caramel's scheduling, metrics, progress and weights check for
    the rest of `fit`. `local_variables` (or `register_local_var`) are each rank's own: not
    broadcast, and left out of the weights check."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        del device  # where Horovod placed its broadcast on GPUs
        check_root(root_rank, "BroadcastGlobalVariablesCallback")
        super().__init__(checkpoints=False, local_variables=tf.nest.flatten(local_variables) if local_variables is not None else ())
        self.root_rank = root_rank

    def register_local_var(self, var: Any) -> None:
        """Horovod's: keep `var` each rank's own (not broadcast, not checked)."""
        self._local_variables[id(var)] = var
        self._runtime.local_variables[id(var)] = var

    def _start(self, model: tf.keras.Model) -> Ledger:
        if self.root_rank != 0:
            # Caramel's callback takes rank 0's variables: rank 0 takes the root's first.
            variables = [*model.variables, *optimizer_state(model.optimizer, model.trainable_variables)]
            hvd.broadcast_variables([variable for variable in variables if id(variable) not in self._local_variables], self.root_rank)
        return super()._start(model)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        _caramel_final_check.checked_by_fit()


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """The epoch's logs averaged over the ranks at the end of every epoch, in place, so that the
    callbacks after this one see the averages."""

    def __init__(self, device: str = "") -> None:
        del device
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        names = sorted(logs)  # the same order on every rank
        values = tf.constant([float(logs[name]) for name in names], tf.float64)
        averaged = backend().all_reduce([values], ReduceOp.AVERAGE, "hvd_metric_average")[0].numpy()
        for name, value in zip(names, averaged):
            logs[name] = float(value)


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """The learning rate `initial_lr * multiplier(epoch)` from start_epoch to end_epoch (exclusive):
    set at each epoch's start (staircase) or each batch's (the epoch then counts the batches done:
    epoch + batch / steps_per_epoch). A constant multiplier m means m ** epoch."""

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError(f"{type(self).__name__} needs initial_lr, the learning rate the multiplier scales")
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier**epoch)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} needs the steps per epoch: pass steps_per_epoch to fit or to the callback")
        if self.momentum_correction:
            _momentum_slots(self.model.optimizer, type(self).__name__)  # refuses what it cannot correct, before any step

    @property
    def observes_single_batches(self) -> bool:
        """Whether it acts on single batches (caramel.tensorflow.fit_steps): a staircase acts at an
        epoch's first batch only, which Keras calls whatever the steps per execution."""
        return not self.staircase

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    @property
    def _epoch_steps(self) -> int:
        """The steps per epoch, as given or as fit said at its start."""
        if not self.steps_per_epoch:
            raise ValueError(f"{type(self).__name__} needs the steps per epoch: pass steps_per_epoch to fit or to the callback")
        return self.steps_per_epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        epoch = self.current_epoch
        if epoch is None or epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if not self.staircase:
            self._adjust(epoch + batch / self._epoch_steps)
        elif batch == 0:
            self._adjust(epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = self._learning_rate()

    def _learning_rate(self) -> float:
        return float(self.model.optimizer.learning_rate)

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old, new = self._learning_rate(), self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new
        if self.momentum_correction and old:
            for slot in _momentum_slots(optimizer, type(self).__name__):
                slot.assign(slot * (new / old))


def _momentum_slots(optimizer: Any, feature: str) -> list[Any]:
    """The momentum variables whose scaling by new_lr / old_lr is Horovod's momentum correction
    (empty where there is no momentum, or the optimizer has not made them yet: zeros need none)."""
    momentum = getattr(optimizer, "momentum", 0.0)
    if not isinstance(momentum, int | float) or momentum == 0:
        if momentum:
            refuse(f"{feature}(momentum_correction=True) with a momentum that is not a number", "pass momentum_correction=False")
        return []
    if isinstance(optimizer, tf.keras.optimizers.SGD):
        if optimizer.nesterov:
            refuse(f"{feature}(momentum_correction=True) with SGD(nesterov=True)", "pass momentum_correction=False")
        return list(getattr(optimizer, "momentums", []))
    if isinstance(optimizer, tf.keras.optimizers.RMSprop):
        return list(getattr(optimizer, "_momentums", []))
    refuse(f"{feature}(momentum_correction=True) with {type(optimizer).__name__}", "pass momentum_correction=False")


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up over warmup_epochs, batch by batch, from initial_lr / size to initial_lr (Goyal
    et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour"):
    lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1), the epoch counting the
    batch about to run as done, so that the last batch of the warm-up runs at initial_lr."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            size = hvd.size()
            return (1 + (epoch + 1 / self._epoch_steps) * (size - 1) / warmup_epochs) / size

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)  # fmt: skip
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.verbose > 0 and epoch + 1 == self.end_epoch and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: the learning rate warm-up ended at {self._learning_rate():g}.", flush=True)


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """Keras' ModelCheckpoint keeping only the best model (save_best_only), written by rank 0 alone
    (every rank holds the same weights). Horovod's takes no path: its Spark estimator sets
    `filepath` before training; give it here, or set `callback.filepath` before `fit`."""

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        filepath: str | None = None,
    ) -> None:
        # Keras 3 checks the path's extension when made: a stand-in until the real one is known.
        super().__init__(filepath or ("best.weights.h5" if save_weights_only else "best.keras"), monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)  # fmt: skip
        self.filepath = filepath

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.filepath:
            raise ValueError("hvd.callbacks.BestModelCheckpoint needs a filepath: BestModelCheckpoint(filepath=...), or set callback.filepath")
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if hvd.rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if hvd.rank() == 0:
            super().on_epoch_end(epoch, logs)


__all__ = [
    "BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
    "MetricAverageCallback",
]  # fmt: skip
