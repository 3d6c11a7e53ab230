"""Horovod's API for standalone Keras (`import horovod.keras as hvd`). Under TensorFlow 2.16+ Keras
is Keras 3 running on TensorFlow, so this is `horovod.tensorflow.keras`, served by Caramel."""

from horovod.tensorflow.keras import *  # noqa: F403
from horovod.tensorflow.keras import __all__, callbacks, elastic  # noqa: F401
