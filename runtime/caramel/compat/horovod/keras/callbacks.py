"""Horovod's callbacks for standalone Keras (`horovod.keras.callbacks`): those of
`horovod.tensorflow.keras.callbacks`, served by Caramel, and BestModelCheckpoint with standalone
Keras' parameters (no save_weights_only)."""

from horovod.tensorflow.keras import callbacks as _tensorflow_keras
from horovod.tensorflow.keras.callbacks import *  # noqa: F403
from horovod.tensorflow.keras.callbacks import __all__  # noqa: F401


class BestModelCheckpoint(_tensorflow_keras.BestModelCheckpoint):  # type: ignore[no-redef]  # standalone Keras' own replaces tf.keras'
    """horovod.tensorflow.keras.callbacks.BestModelCheckpoint, saving the whole model."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto", save_freq: str | int = "epoch", filepath: str | None = None) -> None:
        super().__init__(monitor=monitor, verbose=verbose, mode=mode, save_freq=save_freq, filepath=filepath)
