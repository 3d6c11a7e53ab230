"""Horovod's elastic Keras training (`hvd.elastic` of horovod.tensorflow.keras), which Caramel does
not serve: every name in it fails when used, naming it; `dir()` lists Horovod 0.28.1's names."""

from horovod._caramel_support import unsupported_module
from horovod.tensorflow.elastic import ADVICE

NAMES = ("CommitStateCallback", "KerasState", "TensorFlowKerasState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run")

__getattr__, __dir__ = unsupported_module(__name__, "hvd.elastic", ADVICE, NAMES)
