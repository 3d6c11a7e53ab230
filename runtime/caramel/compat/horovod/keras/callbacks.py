"""Horovod's callbacks for standalone Keras (`horovod.keras.callbacks`): those of
`horovod.tensorflow.keras.callbacks`, served by Caramel."""

from horovod.tensorflow.keras.callbacks import *  # noqa: F403
from horovod.tensorflow.keras.callbacks import __all__  # noqa: F401
