"""Plain Horovod in a benchmark's training process, past Caramel's own `horovod` package.

Caramel's worker entrypoint puts the directory of Caramel's `horovod` package (Horovod's API as
Caramel serves it, `caramel.compat`) first on every training process's PYTHONPATH, so that
`import horovod.tensorflow` in a user's script gets Caramel's implementation. A baseline that
measures *Horovod itself* must not get it: `horovod_tensorflow()` takes that directory off
`sys.path` as the plain-Horovod runner does (`plain_horovod_runner.drop_caramels_horovod`),
and imports the real `horovod.tensorflow`, refusing to go on if it still got Caramel's.

Horovod 0.28.1's TF2 API and Keras 3: `hvd.DistributedGradientTape` keys its gradients by
`source.ref()`, which Keras 3 variables lack (horovod#4290); the benchmarks give the tape the
underlying `tf.Variable`s as sources (`variables_of`), a benchmark-only adaptation that leaves
what Horovod sends and when unchanged. Horovod's Keras layer (`horovod.tensorflow.keras`:
`DistributedOptimizer`, its callbacks) needs Keras 2 and is not used.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import cast

import tensorflow as tf

from benchmarks.plain_horovod_runner import caramel_compat_dir, drop_caramels_horovod, is_caramels


def horovod_tensorflow() -> ModuleType:
    """The real Horovod's `horovod.tensorflow`, whatever the process's path says."""
    drop_caramels_horovod(sys.path, os.environ, sys.modules)
    module = importlib.import_module("horovod.tensorflow")
    if is_caramels(path_entry(module), caramel_compat_dir()):
        raise RuntimeError(f"got Caramel's horovod package ({module.__file__}), not Horovod's, after taking it off sys.path")
    return module


def caramels_horovod_tensorflow() -> ModuleType:
    """The `horovod.tensorflow` an unchanged script imports in a Caramel job: Caramel's (the
    worker entrypoint put its package first on the path)."""
    module = importlib.import_module("horovod.tensorflow")
    if not is_caramels(path_entry(module), caramel_compat_dir()):
        raise RuntimeError(f"got Horovod's own horovod package ({module.__file__}), not Caramel's: is the worker run by caramel's entrypoint?")
    return module


def path_entry(module: ModuleType) -> str:
    """The path entry a `horovod.tensorflow` module was imported from (the directory holding `horovod`)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(cast(str, module.__file__))))


def variables_of(variables: Sequence[tf.Variable]) -> list[tf.Variable]:
    """The `tf.Variable`s under Keras 3 variables, for Horovod's tape and broadcast, which call
    `.ref()` on what they are given (horovod#4290)."""
    return [variable if isinstance(variable, tf.Variable) else variable.value for variable in variables]
