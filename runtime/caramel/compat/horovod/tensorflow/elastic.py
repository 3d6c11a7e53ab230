"""Horovod's elastic training (`hvd.elastic`), which Caramel does not serve: every name in it fails
when used, naming it (its classes when made or subclassed); `dir()` lists Horovod 0.28.1's names."""

from horovod._caramel_support import unsupported_module

ADVICE = (
    "a Caramel job's gang shrinks and grows between restarts instead (spec.workers.minReplicas) and resumes from "
    "its checkpoint; train without hvd.elastic"
)
NAMES = (
    "HorovodInternalError", "ObjectState", "TensorFlowKerasState", "TensorFlowState", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "init", "rank", "run", "run_fn", "shutdown",
)  # fmt: skip

__getattr__, __dir__ = unsupported_module(__name__, "hvd.elastic", ADVICE, NAMES)
