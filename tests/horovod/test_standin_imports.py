"""Caramel's `horovod` package (runtime/caramel/compat/horovod) loads its API on first use: importing
Horovod's ops through it (`horovod.tensorflow.mpi_ops`, as Caramel's Horovod backend does) loads
nothing of Caramel's runtime, so the backend's import does not loop back into caramel.tensorflow.

One short training process with the package first on its path, as the worker entrypoint puts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from caramel.launch.entrypoint import HOROVOD_API_DIR
from conftest import REPO, needs_horovod

CODE = """
import json, sys
import horovod.tensorflow.mpi_ops
after_ops = {"caramel.tensorflow": "caramel.tensorflow" in sys.modules, "tensorflow_api": "horovod.tensorflow._caramel_api" in sys.modules}
import horovod.tensorflow as hvd
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
    "after_ops": after_ops, "unknown": unknown, "dir": [name for name in ("DistributedOptimizer", "init", "elastic", "functions") if name in names],
    "init": f"{init.__module__}.{init.__name__}", "loaded": "caramel.tensorflow" in sys.modules,
    "elastic": hvd.elastic.__name__, "keras": hvd.keras.__name__, "ops": hvd.mpi_ops is sys.modules["horovod.tensorflow.mpi_ops"],
    "star": sorted(set(hvd.__all__) - set(star)),
}))
"""


@needs_horovod
def test_importing_horovods_ops_through_the_package_loads_nothing_of_caramels_runtime():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HOROVOD_API_DIR, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["after_ops"] == {"caramel.tensorflow": False, "tensorflow_api": False}  # no loop back into the runtime
    assert found["unknown"] == "module 'horovod.tensorflow' has no attribute 'no_such_name'"
    assert found["dir"] == ["DistributedOptimizer", "init", "elastic", "functions"]
    assert found["init"] == "horovod.tensorflow._caramel_api.init" and found["loaded"]  # the API, loaded on first use
    assert (found["elastic"], found["keras"], found["ops"]) == ("horovod.tensorflow.elastic", "horovod.tensorflow.keras", True)
    assert found["star"] == []  # every name of __all__ is served
    # What Horovod was built with is Horovod's own answer (the GPU image's has NCCL and CUDA).
    assert found["built"] == found["horovods"] and found["built"]["gloo_built"] is True
