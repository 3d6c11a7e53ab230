"""Caramel's horovod backend loads the real Horovod's ops from the real Horovod's own directory,
not through Caramel's `horovod` package (runtime/caramel/compat/horovod), which is built on the
runtime the backend is part of: importing the backend loads neither that package nor
caramel.tensorflow. A script that imports the package afterwards finds the same ops, and the real
Horovod's modules, where Horovod's own packages hold them.

One short training process with the package first on its path, as the worker entrypoint puts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from caramel.launch.entrypoint import HOROVOD_API_DIR
from conftest import REPO, needs_horovod

CODE = """
import json, sys
import caramel.collectives.horovod_backend as backend
after_backend = sorted(name for name in ("horovod", "horovod.tensorflow", "caramel.tensorflow") if name in sys.modules)
import horovod.tensorflow as hvd
import horovod.tensorflow.keras
import horovod.tensorflow.mpi_ops
import horovod.common.exceptions
try:
    hvd.no_such_name
    unknown = None
except AttributeError as error:
    unknown = str(error)
names = dir(hvd)
star = {}
exec("from horovod.tensorflow import *", star)
init = hvd.init
features = ("gloo_built", "mpi_built", "nccl_built", "cuda_built")
built = {name: getattr(hvd, name)() for name in features}
print(json.dumps({
    "built": built, "horovods": {name: getattr(horovod.tensorflow.mpi_ops, name)() for name in features},
    "after_backend": after_backend, "backend_ops": backend.mpi_ops.__file__, "exceptions": horovod.common.exceptions.__file__,
    "unknown": unknown, "dir": [name for name in ("DistributedOptimizer", "init", "elastic", "functions") if name in names],
    "init": f"{init.__module__}.{init.__name__}", "loaded": "caramel.tensorflow" in sys.modules,
    "elastic": hvd.elastic.__name__, "keras": hvd.keras.__name__, "ops": hvd.mpi_ops is backend.mpi_ops,
    "star": sorted(set(hvd.__all__) - set(star)),
}))
"""


@needs_horovod
def test_the_backend_loads_horovods_ops_from_the_real_horovod_not_through_caramels_package():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HOROVOD_API_DIR, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["after_backend"] == []  # neither Caramel's horovod package nor the runtime above the backend
    real = Path(found["backend_ops"]).parent.parent
    assert real != Path(HOROVOD_API_DIR) / "horovod" and (real / "tensorflow" / "mpi_ops.py").is_file()
    assert Path(found["exceptions"]).parent.parent == real  # horovod.common, the real Horovod's, an attribute of the package
    assert found["unknown"] == "module 'horovod.tensorflow' has no attribute 'no_such_name'"
    assert found["dir"] == ["DistributedOptimizer", "init", "elastic", "functions"]
    assert found["init"] == "horovod.tensorflow._caramel_api.init" and found["loaded"]
    assert (found["elastic"], found["keras"], found["ops"]) == ("horovod.tensorflow.elastic", "horovod.tensorflow.keras", True)
    assert found["star"] == []  # every name of __all__ is served
    # What Horovod was built with is Horovod's own answer (the GPU image's has NCCL and CUDA).
    assert found["built"] == found["horovods"] and found["built"]["gloo_built"] is True
