"""Run a script as plain Horovod runs it: `python -m benchmarks.plain_horovod_runner SCRIPT ARGS...`.

The baseline of `horovod_scripts_bench.py`: a script written for Horovod's TF2 API, run by Horovod
0.28.1 itself, in the Keras 2 world it was written for, on this project's TensorFlow. As a job's
`spec.command` (`[python, -m, benchmarks.plain_horovod_runner, SCRIPT, ...]`) it starts exactly as
Caramel's runs of the same script do: the worker entrypoint, the rendezvous, Horovod's Gloo over
the same environment contract (Horovod reads the HOROVOD_* variables the contract sets). What the
runner changes, in this process only, before the script runs:

- Caramel's `horovod` package is gone: the worker entrypoint puts its directory (`caramel/compat`)
  first on the training process's PYTHONPATH; the runner takes it off `sys.path` and off
  PYTHONPATH (for anything the script starts) and forgets any `horovod*` module already
  imported, so `import horovod.tensorflow` gets the real Horovod, and it refuses to go on if not.
- Keras 2: Horovod 0.28.1's Python API breaks on Keras 3 (its tape calls `.ref()` on Keras 3
  variables, horovod#4290; its Keras layer and callbacks need Keras 2's backend, `K.constant`).
  TF_USE_LEGACY_KERAS=1 is set before TensorFlow is imported, so `tf.keras` is tf-keras (Keras
  2.21, which `make setup` installs without its dependencies), and `import keras` (which
  Horovod's Keras callbacks do: `from keras import backend as K`) gets tf-keras too, as the
  `keras` package was Keras 2 when Horovod 0.28.1 was released: `keras` and every `keras.X` are
  `tf_keras` and `tf_keras.X` (the same module objects).

Then the script runs as `__main__` with its own argv, with its directory first on `sys.path`, as
`python SCRIPT ARGS...` would. The runner imports nothing of TensorFlow or Caramel itself.

The worker entrypoint sizes TensorFlow's thread pools of every training process it starts
(`caramel.contract.cpus`), where the job's env leaves them unset. Plain Horovod, as its users
start it, has TensorFlow's own pools: a baseline's job sets TENSORFLOWS_OWN_POOLS in its spec.env
(`0` is TensorFlow's own size).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys
from collections.abc import MutableMapping, MutableSequence
from typing import Any

USAGE = "usage: python -m benchmarks.plain_horovod_runner SCRIPT [ARGS...]"
# A directory holding Caramel's `horovod` package has this file in it (Horovod has no such module).
CARAMEL_MARKER = os.path.join("horovod", "_caramel_support.py")
KERAS_2 = "tf_keras"
TENSORFLOWS_OWN_POOLS = [{"name": "TF_NUM_INTRAOP_THREADS", "value": "0"}, {"name": "TF_NUM_INTEROP_THREADS", "value": "0"}]


def caramel_compat_dir() -> str | None:
    """The directory the worker entrypoint puts first on the path (`caramel/compat`), found without
    importing Caramel (whose package would import nothing heavy, but need not be importable here)."""
    spec = importlib.util.find_spec("caramel")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "compat")


def is_caramels(entry: str, compat_dir: str | None) -> bool:
    """Whether a path entry holds Caramel's `horovod` package."""
    path = os.path.realpath(entry or os.curdir)
    return (compat_dir is not None and path == os.path.realpath(compat_dir)) or os.path.isfile(os.path.join(path, CARAMEL_MARKER))


def drop_caramels_horovod(path: MutableSequence[str], environ: MutableMapping[str, str], modules: MutableMapping[str, Any]) -> list[str]:
    """Take Caramel's `horovod` package off the import path and PYTHONPATH, and forget any `horovod*`
    module imported already. Returns the path entries removed."""
    compat_dir = caramel_compat_dir()
    removed = [entry for entry in path if is_caramels(entry, compat_dir)]
    path[:] = [entry for entry in path if entry not in removed]
    if environ.get("PYTHONPATH"):
        kept = [entry for entry in environ["PYTHONPATH"].split(os.pathsep) if entry and not is_caramels(entry, compat_dir)]
        if kept:
            environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del environ["PYTHONPATH"]
    for name in [name for name in modules if name.split(".")[0] == "horovod"]:
        del modules[name]
    importlib.invalidate_caches()
    return removed


class KerasIsTfKeras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`keras` and `keras.X` imported as `tf_keras` and `tf_keras.X`: the module objects themselves,
    each with its own name and spec, so that `keras.backend is tf_keras.backend`."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (the finder protocol)
        if fullname == "keras" or fullname.startswith("keras."):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001
        return None  # a placeholder, replaced in sys.modules by exec_module

    def exec_module(self, module) -> None:  # noqa: ANN001
        name = module.__spec__.name
        # The import system hands on whatever sys.modules holds under the name once this returns.
        sys.modules[name] = importlib.import_module(KERAS_2 + name[len("keras"):])


def use_keras_2(environ: MutableMapping[str, str], modules: MutableMapping[str, Any], meta_path: MutableSequence[Any]) -> None:
    """tf.keras is tf-keras (TF_USE_LEGACY_KERAS=1, read when tf.keras is first used), and so is `import keras`."""
    if "tensorflow" in modules or any(name == "keras" or name.startswith("keras.") for name in modules):
        raise RuntimeError("TensorFlow or Keras was imported before the runner set up Keras 2: nothing may import them before it")
    if importlib.util.find_spec(KERAS_2) is None:
        raise RuntimeError(
            "tf-keras (Keras 2) is not installed: plain Horovod's Keras API needs it; `make setup` "
            "installs it without its dependencies (pyproject.toml, [tool.caramel] without-dependencies)"
        )
    environ["TF_USE_LEGACY_KERAS"] = "1"
    if not any(isinstance(finder, KerasIsTfKeras) for finder in meta_path):
        meta_path.insert(0, KerasIsTfKeras())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    script = os.path.abspath(argv[0])
    if not os.path.isfile(script):
        print(f"plain_horovod_runner: {argv[0]!r} is not a file", file=sys.stderr)
        raise SystemExit(2)
    first = sys.path[0] if sys.path else None  # the working directory, which `-m` put first
    drop_caramels_horovod(sys.path, os.environ, sys.modules)
    use_keras_2(os.environ, sys.modules, sys.meta_path)
    horovod = importlib.util.find_spec("horovod")
    if horovod is None:
        raise RuntimeError("Horovod is not installed (make setup builds it)")
    if is_caramels(os.path.dirname(os.path.dirname(horovod.origin or "")), caramel_compat_dir()):
        raise RuntimeError(f"the path still leads to Caramel's horovod package ({horovod.origin})")
    # As `python SCRIPT`: the script's directory first on the path, where `-m` put the working directory.
    if sys.path and sys.path[0] == first:
        sys.path[0] = os.path.dirname(script)
    else:
        sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script, *argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
