"""Horovod's elastic Keras training (`hvd.elastic` of horovod.tensorflow.keras), which Caramel does
not serve: every name in it fails when called, naming it."""

from horovod._caramel_support import unsupported_module
from horovod.tensorflow.elastic import ADVICE

__getattr__ = unsupported_module(__name__, "hvd.elastic", ADVICE)
