"""Horovod's elastic training for standalone Keras (`horovod.keras.elastic`), which Caramel does not
serve: that of horovod.tensorflow.keras, whose every name fails when used, naming it."""

from horovod.tensorflow.keras.elastic import NAMES, __dir__, __getattr__  # noqa: F401
