"""Horovod's training API as Caramel serves it: scripts written for Horovod run unchanged.

This `horovod` package is not Horovod. The worker entrypoint puts the directory holding it first
on every training process's PYTHONPATH, so `import horovod.tensorflow as hvd` (or
`horovod.tensorflow.keras`) in a script gets Caramel's implementation of Horovod's TensorFlow 2 API,
which runs on Caramel's runtime (`caramel.tensorflow`): Caramel's collectives, scheduling, metrics
and checks. Horovod's own Python API breaks on Keras 3; its C++ ops do not.

Where Horovod itself is installed, this package's path goes on into the real one: modules it does
not define itself (`horovod.common`, `horovod.runner`, `horovod.tensorflow.mpi_ops`) are the real
Horovod's. (Caramel's Horovod backend loads Horovod's ops from the real Horovod's directory itself:
`caramel.collectives.horovod_installation`.) Without Horovod, the scripts run on TensorFlow's own
collectives.

What Caramel does not serve fails when called, with an error that names it
(`NotSupportedByCaramel`, in `horovod._caramel_support`).
"""

from __future__ import annotations

import sys as _sys

from caramel.collectives.horovod_installation import bind_loaded_submodules, real_horovod_dir
from horovod._caramel_support import NotSupportedByCaramel, unsupported

__version__ = "0.28.1"
"""The Horovod release whose API this package serves."""

_real_horovod_dir = real_horovod_dir()
"""The real Horovod's package directory, or None where Horovod is not installed."""
if _real_horovod_dir is not None:
    # Scripts import the real Horovod's modules this package does not define (horovod.common's
    # exceptions, horovod.tensorflow.mpi_ops) as they would from Horovod: the path goes on there.
    __path__.append(_real_horovod_dir)
    bind_loaded_submodules(_sys.modules[__name__])

run = unsupported(
    "horovod.run", "the CaramelJob (or `caramel run job.yaml`) starts the ranks; call the training function in the script directly"
)

__all__ = ["NotSupportedByCaramel", "__version__", "run"]
