"""Horovod's elastic training (`hvd.elastic`), which Caramel does not serve: every name in it fails
when called, naming it."""

from horovod._caramel_support import unsupported_module

ADVICE = (
    "a Caramel job's gang shrinks and grows between restarts instead (spec.workers.minReplicas) and resumes from "
    "its checkpoint; train without hvd.elastic"
)

__getattr__ = unsupported_module(__name__, "hvd.elastic", ADVICE)
