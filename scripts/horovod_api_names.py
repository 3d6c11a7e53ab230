"""The API surface of the real Horovod's TensorFlow 2 modules, as data for tests/horovod/test_horovod_api.py.

    .venv/bin/python scripts/horovod_api_names.py > tests/data/horovod-0.28.1-api.json

Run where Horovod 0.28.1 and tf-keras are installed (`make setup`): it imports the real Horovod past
Caramel's `horovod` package, on Keras 2, as the benchmarks' plain-Horovod runner does
(benchmarks/plain_horovod_runner.py), and writes, for each module a training script imports, every
public name Horovod defines there (functions, classes, its op constants, its own submodules; not
what it merely imports, such as `tf` or `os`) with its parameters in order (null for a constant or
a module). The file is committed: CI without Horovod cannot make it. horovod.tensorflow.functions is
left out, an implementation module whose functions horovod.tensorflow serves.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.plain_horovod_runner import drop_caramels_horovod, use_keras_2  # noqa: E402

MODULES = (
    "horovod", "horovod.tensorflow", "horovod.tensorflow.compression", "horovod.tensorflow.sync_batch_norm",
    "horovod.tensorflow.elastic", "horovod.tensorflow.keras", "horovod.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic", "horovod.keras", "horovod.keras.callbacks", "horovod.keras.elastic",
)  # fmt: skip


def parameters(value: object) -> list[str] | None:
    """The names of a function's or a class's parameters, in order; None for anything else."""
    if not callable(value):
        return None
    try:
        return list(inspect.signature(value).parameters)
    except (TypeError, ValueError):
        return None


def horovods(value: object) -> bool:
    """Whether Horovod defines `value` (or it is one of its op constants, plain integers)."""
    if isinstance(value, types.ModuleType):
        return value.__name__.startswith("horovod.")
    if isinstance(value, int):
        return True
    return (getattr(value, "__module__", None) or "").startswith("horovod.")


def main() -> None:
    drop_caramels_horovod(sys.path, os.environ, sys.modules)
    use_keras_2(os.environ, sys.modules, sys.meta_path)
    surface: dict[str, dict[str, list[str] | None]] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        public = {attribute: getattr(module, attribute) for attribute in dir(module) if not attribute.startswith("_")}
        surface[name] = {
            attribute: None if isinstance(value, types.ModuleType) else parameters(value)
            for attribute, value in sorted(public.items())
            if horovods(value)
        }
    version = importlib.import_module("horovod").__version__
    json.dump({"horovod": version, "modules": surface}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
