"""Where the real Horovod is, beside Caramel's own `horovod` package, and how its modules load.

A training process has two `horovod` packages on its path: Caramel's (the stand-in that serves
Horovod's API, `caramel.compat.horovod`), first, and the real Horovod where it is installed. The
horovod backend loads the real Horovod's ops from the real Horovod's own directory, never through
Caramel's package, which is built on the runtime the backend is part of. (No TensorFlow here: the
worker entrypoint takes HOROVOD_API_DIR from this module.)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from types import ModuleType

import caramel

HOROVOD_API_DIR = os.path.join(os.path.dirname(os.path.abspath(caramel.__file__)), "compat")
"""The directory holding Caramel's `horovod` package (Horovod's training API served by Caramel),
which the worker entrypoint puts first on every training process's path."""


def real_horovod_dir() -> str | None:
    """The real Horovod's `horovod` package directory, found on sys.path but for the directory of
    Caramel's own; None where Horovod is not installed."""
    stand_in = os.path.realpath(HOROVOD_API_DIR)
    elsewhere = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != stand_in]
    spec = PathFinder.find_spec("horovod", elsewhere)
    if spec is None or not spec.origin or os.path.basename(spec.origin) != "__init__.py":
        return None  # not installed, or only a directory named horovod (not a package)
    return os.path.dirname(spec.origin)


def real_horovod_module(name: str) -> ModuleType:
    """The real Horovod's module `name` (e.g. `horovod.tensorflow.mpi_ops`), or the one loaded
    already. Where `import horovod` is Caramel's package, it is loaded from the real Horovod's
    directory under its own name: a module of Horovod that `name` imports is found from the
    package loaded first (`horovod.common`) or loaded so before (`horovod.tensorflow.util`, which
    `horovod.tensorflow.mpi_ops` imports). Where it is the real Horovod, it is imported."""
    if name in sys.modules:
        return sys.modules[name]
    directory = real_horovod_dir()
    if directory is None:
        raise ModuleNotFoundError(f"Horovod is not installed: no {name}", name=name)
    if _imported_horovod_dir() == directory:
        return importlib.import_module(name)
    path = os.path.join(directory, *name.split(".")[1:])
    if os.path.isdir(path):
        spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"), submodule_search_locations=[path])
    else:
        spec = importlib.util.spec_from_file_location(name, f"{path}.py")
    assert spec is not None and spec.loader is not None, f"{name} is a module file of Horovod's"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # as the import system does: a package's loaded module is its attribute
        setattr(sys.modules[parent], child, module)
    return module


def _imported_horovod_dir() -> str | None:
    """The directory of the `horovod` package that `import horovod` gets (or got)."""
    loaded = sys.modules.get("horovod")
    spec = loaded.__spec__ if loaded is not None else PathFinder.find_spec("horovod", sys.path)
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def bind_loaded_submodules(package: ModuleType) -> None:
    """Make the modules loaded under `package` before it its attributes, as the import system makes
    every submodule it loads: where the horovod backend loaded the real Horovod's (`horovod.common`,
    `horovod.tensorflow.mpi_ops`) before a script imported Caramel's `horovod` packages, which
    hold them as Horovod's own packages do."""
    prefix = f"{package.__name__}."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and "." not in name[len(prefix) :]:
            setattr(package, name[len(prefix) :], module)
