"""Horovod's training API as Caramel serves it: scripts written for Horovod run unchanged.

This `horovod` package is not Horovod. The worker entrypoint puts the directory holding it first
on every training process's PYTHONPATH, so `import horovod.tensorflow as hvd` (or
`horovod.tensorflow.keras`) in a script gets Caramel's implementation of Horovod's TensorFlow 2 API,
which runs on Caramel's runtime (`caramel.tensorflow`): Caramel's collectives, scheduling, metrics
and checks. Horovod's own Python API breaks on Keras 3; its C++ ops do not.

Where Horovod itself is installed, this package's path goes on into the real one: modules it does
not define itself (`horovod.common`, `horovod.runner`, `horovod.tensorflow.mpi_ops`, which Caramel's
Horovod backend uses) are the real Horovod's. Without Horovod, the scripts run on TensorFlow's own
collectives.

What Caramel does not serve fails when called, with an error that names it
(`NotSupportedByCaramel`, in `horovod._caramel_support`).

Importing `horovod` or `horovod.tensorflow` loads nothing of Caramel's runtime (`caramel.tensorflow`)
or of TensorFlow: their names are loaded on first use (each package's `__getattr__`), so that the
real Horovod's modules that Caramel's Horovod backend imports through them do not import back into
the runtime the backend is part of.
"""

from __future__ import annotations

import os as _os
import sys as _sys
import typing as _typing
from importlib.machinery import PathFinder as _PathFinder

__version__ = "0.28.1"
"""The Horovod release whose API this package serves."""


def _find_real_horovod() -> str | None:
    """The directory of the real Horovod's `horovod` package, if one is installed: found on
    sys.path without the directory that holds this package."""
    here = _os.path.realpath(_os.path.dirname(__file__))
    shim_root = _os.path.dirname(here)
    elsewhere = [entry for entry in _sys.path if _os.path.realpath(entry or _os.curdir) != shim_root]
    spec = _PathFinder.find_spec(__name__, elsewhere)
    if spec is None or not spec.origin or _os.path.basename(spec.origin) != "__init__.py":
        return None  # not installed, or only a directory named horovod (not a package)
    found = _os.path.dirname(spec.origin)
    return None if _os.path.realpath(found) == here else found


_real_horovod_dir = _find_real_horovod()
"""The real Horovod's package directory, or None where Horovod is not installed."""
if _real_horovod_dir is not None:
    __path__.append(_real_horovod_dir)

__all__ = ["NotSupportedByCaramel", "__version__", "run"]


def __getattr__(name: str) -> _typing.Any:
    """`NotSupportedByCaramel` and `run`, which come from caramel.tensorflow, loaded on first use
    (PEP 562): importing the package alone, as Horovod's own modules do (horovod.common,
    horovod.tensorflow.mpi_ops, which Caramel's Horovod backend imports), loads nothing of
    Caramel's runtime."""
    if name == "NotSupportedByCaramel":
        from horovod._caramel_support import NotSupportedByCaramel

        globals()[name] = NotSupportedByCaramel
        return NotSupportedByCaramel
    if name == "run":
        from horovod._caramel_support import unsupported

        globals()[name] = run = unsupported(
            "horovod.run",
            "the CaramelJob (or `caramel run job.yaml`) starts the ranks; call the training function in the script directly",
        )
        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
