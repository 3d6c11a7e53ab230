"""Scripts written for Horovod's TF2 API run unchanged under Caramel, which serves the `horovod`
package itself (runtime/caramel/compat/horovod).

Unit tests run a training process of a one-rank job (TensorFlow's collectives, which need no
server for one rank) with the package first on its path, as the worker entrypoint puts it: the
import mechanics, the refusals, the collectives' semantics (the ragged allgather against a fake of
three ranks), the Keras 2 idioms, the learning rate callbacks and the weights check at exit. The
end-to-end tests (marked e2e) run two workers under `caramel run`: our four scripts in the shape
of Horovod's TF2 examples, the collectives across real ranks, and Horovod-shaped training against
synchronous SGD computed here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from caramel.contract.env import slot_env, worker_env
from caramel.contract.jobfile import parse_job
from caramel.launch.entrypoint import HOROVOD_API_DIR
from conftest import REPO, free_port, horovod_installed, job_manifest, keras_env, needs_horovod, run_caramel, write_manifest
from testbed.local_runs import digests

HOROVOD_EXAMPLES = REPO / "examples" / "horovod"
SHIM = Path(HOROVOD_API_DIR) / "horovod"


def one_rank_env(backend: str = "tensorflow", keras: int = 3) -> dict[str, str]:
    """The environment of the training process of a one-rank job on Keras `keras`, Caramel's
    `horovod` first on its path."""
    job = parse_job({
        "apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "unit"},
        "spec": {"command": ["python"], "workers": {"replicas": 1}, "metrics": {"enabled": False},
                 "rendezvous": {"port": free_port()}, "caramel": {"backend": backend}, "env": keras_env(keras)},
    })  # fmt: skip
    env = {**os.environ, **worker_env(job, 0, ["127.0.0.1"])}
    env.update(slot_env(env, 0))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HOROVOD_API_DIR, env.get("PYTHONPATH")]))  # as the worker entrypoint puts it
    return env


def run_one_rank(code: str, backend: str = "tensorflow", timeout: float = 180, keras: int = 3) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=one_rank_env(backend, keras), cwd=REPO, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def results_of(code: str, backend: str = "tensorflow", keras: int = 3) -> dict:
    """The JSON object the code prints last, after it ran to success."""
    result = run_one_rank(code, backend, keras=keras)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- the package and its path ---------------------------------------------------------------------


@needs_horovod
def test_the_package_is_caramels_and_its_path_goes_on_into_the_real_horovod():
    found = results_of("""
        import json
        import horovod, horovod.tensorflow, horovod.tensorflow.keras, horovod.keras
        from horovod.tensorflow import mpi_ops
        import horovod.common.util
        from caramel.collectives.backend import horovod_installed
        import caramel.collectives.horovod_backend as backend   # Caramel's Horovod backend loads the same mpi_ops from the real Horovod
        print(json.dumps({
            "package": horovod.__file__, "version": horovod.__version__, "tensorflow": horovod.tensorflow.__file__,
            "keras": horovod.tensorflow.keras.__file__, "standalone_keras": horovod.keras.DistributedOptimizer.__module__,
            "mpi_ops": mpi_ops.__file__, "common": horovod.common.util.__file__, "installed": horovod_installed(),
            "backend_ops": backend.mpi_ops is mpi_ops,
        }))
    """)
    assert Path(found["package"]) == SHIM / "__init__.py"
    assert found["version"] == "0.28.1"
    assert Path(found["tensorflow"]) == SHIM / "tensorflow" / "__init__.py"
    assert Path(found["keras"]) == SHIM / "tensorflow" / "keras" / "__init__.py"
    assert found["standalone_keras"] == "horovod.keras"  # Caramel's, with standalone Keras' keywords
    real = Path(found["mpi_ops"]).parent.parent
    assert real != SHIM and (real / "tensorflow" / "mpi_ops.py").is_file()
    assert Path(found["common"]).parent.parent == real
    assert found["installed"] and found["backend_ops"]


def test_without_horovod_the_package_runs_on_tensorflows_collectives(tmp_path):
    """A site directory holding everything but Horovod stands in for an installation without it."""
    site = Path(sysconfig.get_paths()["purelib"])
    without = tmp_path / "site-packages"
    without.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith("horovod"):
            (without / entry.name).symlink_to(entry)
    found = results_of(f"""
        import sys
        sys.path[:] = [entry for entry in sys.path if entry != {str(site)!r}] + [{str(without)!r}]
        import json
        import tensorflow as tf
        import horovod, horovod.tensorflow as hvd
        try:
            from horovod.tensorflow import mpi_ops
            missing = False
        except ImportError:
            missing = True
        hvd.init()
        from caramel.tensorflow.runtime import current
        weights = tf.Variable([1.0, 2.0])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * weights)
        gradient = hvd.DistributedGradientTape(tape).gradient(loss, [weights])[0]
        print(json.dumps({{"real": horovod._real_horovod_dir, "mpi_ops": missing, "backend": current().backend.name,
                           "gloo_built": hvd.gloo_built(), "gradient": gradient.numpy().tolist()}}))
    """, backend="auto")
    assert found == {"real": None, "mpi_ops": True, "backend": "tensorflow", "gloo_built": False, "gradient": [2.0, 4.0]}


def test_the_worker_entrypoint_puts_the_package_first_on_the_training_processes_path(tmp_path):
    job = parse_job({
        "apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "path"},
        "spec": {"command": [sys.executable, "-c", "import horovod; print('horovod from', horovod.__file__)"],
                 "workers": {"replicas": 1}, "rendezvous": {"port": free_port()}, "metrics": {"enabled": False},
                 "env": [{"name": "PYTHONPATH", "value": str(tmp_path)}]},
    })  # fmt: skip
    from caramel.contract.env import worker_command

    env = {**os.environ, **worker_env(job, 0, ["127.0.0.1"])}
    result = subprocess.run(worker_command(job, python=sys.executable), env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"rank 0 | horovod from {SHIM / '__init__.py'}" in result.stdout


def test_the_wheel_ships_every_package_the_horovod_api_included():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = set()
    for name, directory in pyproject["package-dir"].items():
        root = REPO / directory
        on_disk |= {".".join([name, *path.parent.relative_to(root).parts]) for path in root.rglob("__init__.py")}
    assert set(pyproject["packages"]) == on_disk
    # compat/ is a package for the import contracts alone: on the path, `horovod` is top-level (the entrypoint's test above)
    assert (SHIM.parent / "__init__.py").exists()


# -- the surface, against Horovod 0.28.1's ------------------------------------------------------------

# Every public name Horovod 0.28.1 defines in the modules scripts import, with its parameters
# (scripts/horovod_api_names.py, run against the real Horovod; committed, for CI without it).
HOROVOD_API = json.loads((REPO / "tests" / "data" / "horovod-0.28.1-api.json").read_text())
# Horovod's internals that its modules happen to hold, which no script calls and Caramel does not serve.
HOROVOD_INTERNALS = {
    # horovod.common.util's helpers, imported for Horovod's own use
    "check_extension", "check_num_rank_power_of_2", "gpu_available", "handle_average_backwards_compatibility", "split_list",
    "is_version_greater_equal_than",
    # Horovod's machinery of local gradient accumulation (backward_passes_per_step > 1), which Caramel
    # does its own way (caramel.tensorflow.accumulation)
    "LocalGradientAggregationHelper", "gradient_aggregation",
    # the launcher's package (horovod.run, its entry, is served as a refusal) and the C++ ops' modules,
    # which resolve to the real Horovod's where it is installed (Caramel's Horovod backend uses them)
    "runner", "mpi_ops", "util",
}  # fmt: skip
# Names a module of Horovod imports for its own use only; scripts take them from horovod.tensorflow.
IMPORTED_FOR_ITS_OWN_USE = {"horovod.tensorflow.sync_batch_norm": {"Sum", "rank", "size"}}

SURFACE = """
import importlib, inspect, json
import tensorflow as tf
surface = {}
for name in MODULES:
    module = importlib.import_module(name)
    entries = {}
    for attribute in dir(module):
        try:
            entries[attribute] = list(inspect.signature(getattr(module, attribute)).parameters)
        except (TypeError, ValueError):
            entries[attribute] = None
    surface[name] = entries
print(json.dumps(surface))
"""


@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_every_name_of_horovods_api_is_served_with_horovods_parameters(keras):
    """dir() of each module Caramel serves holds every name Horovod 0.28.1's does (its internals
    aside), and each function or class takes Horovod's parameters in Horovod's order (it may take
    more after them); a refusal (a stand-in taking anything) fails when used, as the test above
    shows. Horovod's functions that take anything (its wrappers) are not compared."""
    modules = HOROVOD_API["modules"]
    served = results_of(f"MODULES = {sorted(modules)!r}\n" + SURFACE, keras=keras)
    missing, different = [], []
    for module, names in modules.items():
        for name, parameters in names.items():
            if name in HOROVOD_INTERNALS or name in IMPORTED_FOR_ITS_OWN_USE.get(module, ()):
                continue
            if name not in served[module]:
                missing.append(f"{module}.{name}")
                continue
            ours, anything = served[module][name], ["args", "kwargs"]
            if parameters not in (None, anything) and ours not in (None, anything) and ours[: len(parameters)] != parameters:
                different.append(f"{module}.{name}: Horovod's {parameters}, Caramel's {ours}")
    assert not missing, f"not served: {missing}"
    assert not different, "\n".join(different)


# -- what Caramel does not serve --------------------------------------------------------------------

REFUSED = {
    "hvd.alltoall(tf.constant([1.0]))": "hvd.alltoall",
    "hvd.join()": "hvd.join",
    "hvd.reducescatter(tf.constant([1.0]))": "hvd.reducescatter",
    "hvd.init(process_sets=[hvd.ProcessSet([0])])": "hvd.init(process_sets=...)",
    "hvd.add_process_set([0])": "hvd.add_process_set",
    "hvd.start_timeline('t.json')": "hvd.start_timeline",
    "tf.function(lambda: hvd.broadcast_global_variables(0))()": "hvd.broadcast_global_variables inside a tf.function",
    "hvd.allreduce(tf.constant([1.0]), op=hvd.Adasum)": "hvd.allreduce(op=Adasum)",
    "hvd.allreduce(tf.constant([1.0]), process_set=FakeSet())": "hvd.allreduce(process_set=...)",
    "hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum)": "DistributedGradientTape(op=Adasum)",
    "hvd.DistributedGradientTape(tf.GradientTape(), gradient_predivide_factor=2.0)": "DistributedGradientTape(gradient_predivide_factor=2.0)",
    "hvd.DistributedGradientTape(tf.GradientTape(), process_set=FakeSet())": "DistributedGradientTape(process_set=...)",
    "hk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=hvd.Product)": "DistributedOptimizer(op=Product)",
    "caramel.tensorflow.DistributedGradientTape(tf.GradientTape(), backward_passes_per_step=2)": "DistributedGradientTape(backward_passes_per_step=2)",
    "hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), gradient_predivide_factor=2.0)": "DistributedOptimizer(gradient_predivide_factor=2.0)",
    "hvd.DistributedOptimizer(object())": "hvd.DistributedOptimizer(object)",
    "hvd.DistributedOptimizer(importlib.import_module('tf_keras').optimizers.legacy.Adam())": "hvd.DistributedOptimizer(a legacy Adam)",
    "hvd.init(comm=[0, 1])": "hvd.init(comm=...)",
    "tf.function(lambda: hvd.broadcast_object(1))()": "hvd.broadcast_object inside a tf.function",
    "horovod.run(print, np=2)": "horovod.run",
    "hk.load_model('model.keras', legacy_opts=True)": "hvd.load_model(legacy_opts=True)",
    "hk.reducescatter(1.0)": "hvd.reducescatter",
}


def test_what_caramel_does_not_serve_fails_when_called_naming_the_feature():
    calls = "\n        ".join(f"attempt({call!r})" for call in REFUSED)
    found = results_of(f"""
        import importlib, json
        import tensorflow as tf
        import caramel.tensorflow
        import horovod, horovod.tensorflow as hvd, horovod.tensorflow.keras as hk

        class FakeSet:
            process_set_id = 3

        looked_up = all(hasattr(hvd, name) for name in ("alltoall", "join", "ProcessSet", "SyncBatchNormalization", "elastic"))
        hvd.init()
        messages = {{}}

        def attempt(call):
            try:
                eval(call)
            except Exception as error:
                messages[call] = f"{{type(error).__name__}}: {{error}}"
            else:
                messages[call] = "no error"

        {calls}
        print(json.dumps({{"looked_up": looked_up, "messages": messages}}))
    """)
    assert found["looked_up"]
    for call, feature in REFUSED.items():
        assert found["messages"][call].startswith(f"NotSupportedByCaramel: {feature} is not supported by Caramel: "), (call, found["messages"][call])


# -- the collectives ---------------------------------------------------------------------------------


def test_collectives_on_one_rank_eagerly_and_in_graphs():
    found = results_of("""
        import json
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow as hvd
        import horovod.tensorflow.keras as hk
        hvd.init()
        x = tf.constant([[1.5, -2.0], [3.0, 4.0]])
        sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([3, 2]))
        reduced_sparse = hvd.allreduce(sparse, op=hvd.Sum)  # scaled, Horovod raises NotImplementedError

        @tf.function
        def in_a_graph(t):
            return hvd.allreduce(t), hvd.allgather(t[:1]), hvd.broadcast(t, 0), hvd.grouped_allreduce([t, tf.cast(t, tf.int32)], op=hvd.Sum)

        graph_reduced, graph_gathered, graph_broadcast, grouped = in_a_graph(x)
        print(json.dumps({
            "shape": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
            "average": hvd.allreduce(x).numpy().tolist(),
            "deprecated_sum": hvd.allreduce(x, average=False).numpy().tolist(),
            "fp16": [hvd.allreduce(x, compression=hvd.Compression.fp16).dtype.name],
            "scaled": hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5, op=hvd.Max).numpy().tolist(),
            "sparse": [type(reduced_sparse).__name__, reduced_sparse.values.numpy().tolist(), reduced_sparse.indices.numpy().tolist()],
            "allgather": hvd.allgather(tf.constant([True, False])).numpy().tolist(),
            "allgather_empty": hvd.allgather(tf.zeros([0, 3], tf.uint8)).shape.as_list(),
            "broadcast": hvd.broadcast(tf.constant([7], tf.int64), root_rank=0).numpy().tolist(),
            "broadcast_object": hvd.broadcast_object_fn(root_rank=0)({"a": [1, 2]}),
            "callable_travels": hvd.broadcast_object(lambda: 42)(),
            "allgather_object": hvd.allgather_object({"rank": hvd.rank()}),
            "graph": [graph_reduced.numpy().tolist(), graph_gathered.numpy().tolist(), graph_broadcast.numpy().tolist(),
                      grouped[1].dtype.name],
            "keras": [type(hk.allreduce([1.0, 3.0])).__name__, hk.allgather([[1], [2]]).tolist(), hk.broadcast(5, 0).tolist()],
            "ops": [int(hvd.rank_op()), int(hvd.size_op()), int(hvd.local_rank_op()), int(hvd.local_size_op())],
            "built": [hvd.mpi_built(), hvd.nccl_built(), hvd.cuda_built(), hvd.sycl_built(), hvd.is_initialized()],
        }))
    """)
    x = [[1.5, -2.0], [3.0, 4.0]]
    assert found["shape"] == [0, 1, 0, 1, 0, 1]
    assert found["average"] == x and found["deprecated_sum"] == x
    assert found["fp16"] == ["float32"]  # travels as float16, comes back as it went
    assert found["scaled"] == x
    assert found["sparse"] == ["IndexedSlices", [[1.0, 2.0]], [1]]
    assert found["allgather"] == [True, False]
    assert found["allgather_empty"] == [0, 3]
    assert found["broadcast"] == [7]
    assert found["broadcast_object"] == {"a": [1, 2]} and found["callable_travels"] == 42
    assert found["allgather_object"] == [{"rank": 0}]
    assert found["graph"] == [x, [x[0]], x, "int32"]
    assert found["keras"] == ["ndarray", [[1], [2]], 5]
    assert found["ops"] == [0, 1, 0, 1]
    assert found["built"] == [False, False, False, False, True]


def test_allgather_pads_gathers_and_cuts_different_first_dimensions():
    """Against a fake of three ranks (this process rank 1) whose all_gather is what three real ranks
    running the same code would gather: the first dimensions, then each rank's tensor padded to the
    longest."""
    found = results_of("""
        import json
        import cloudpickle
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow as hvd
        from horovod.tensorflow import _caramel_collectives
        hvd.init()

        class ThreeRanks:
            rank, size = 1, 3

            def __init__(self, tensors):
                self.tensors = [tf.convert_to_tensor(t) for t in tensors]
                self.names = []

            def all_gather(self, tensor, name):
                self.names.append(name)
                if name.endswith("_sizes"):
                    return tf.constant([[t.shape[0]] for t in self.tensors], tf.int64)
                longest = tf.shape(tensor)[0]
                padded = [tensor if rank == self.rank else tf.pad(tf.cast(t, tensor.dtype), [[0, longest - t.shape[0]]] + [[0, 0]] * (t.shape.rank - 1))
                          for rank, t in enumerate(self.tensors)]
                return tf.stack(padded)

        def gather(tensors, graph=False):
            fake = ThreeRanks(tensors)
            _caramel_collectives.backend = lambda: fake
            gathered = (tf.function(hvd.allgather) if graph else hvd.allgather)(fake.tensors[1])
            return gathered.numpy().tolist(), gathered.dtype.name, fake.names

        rows = [np.full([2, 2], 1.0), np.full([0, 2], 2.0), np.full([3, 2], 3.0)]
        flags = [np.array([True]), np.array([False, True, True]), np.array([], bool)]
        objects = [("zero", 0), {"one": list(range(40))}, None]

        def gather_objects():
            fake = ThreeRanks([np.frombuffer(cloudpickle.dumps(obj), np.uint8) for obj in objects])
            _caramel_collectives.backend = lambda: fake
            return hvd.allgather_object(objects[1])

        print(json.dumps({
            "rows": gather(rows), "rows_in_graph": gather(rows, graph=True)[:2], "flags": gather(flags), "objects": gather_objects(),
        }))
    """)
    rows, dtype, names = found["rows"]
    assert rows == [[1.0, 1.0]] * 2 + [[3.0, 3.0]] * 3 and dtype == "float64"
    assert names == ["hvd_allgather_sizes", "hvd_allgather"]
    assert found["rows_in_graph"] == [rows, "float64"]
    assert found["flags"][:2] == [[True, False, True, True], "bool"]
    assert found["objects"] == [["zero", 0], {"one": list(range(40))}, None]


# -- Keras ------------------------------------------------------------------------------------------


def test_keras2_idioms_are_accepted_once_a_script_uses_the_package():
    found = results_of("""
        import json
        import tensorflow as tf
        import horovod.tensorflow as hvd

        def compile_with(keyword):
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            try:
                model.compile(optimizer="sgd", loss="mse", **{keyword: False})
                return "ok"
            except TypeError as error:
                return f"TypeError: {error}"

        optimizer = tf.keras.optimizers.Adam(0.1)
        before = [compile_with("experimental_run_tf_function"), callable(optimizer.variables)]
        hvd.init()
        model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
        model.build((None, 3))
        optimizer.build(model.trainable_variables)
        distributed = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
        distributed.build(model.trainable_variables)
        scaled = tf.keras.optimizers.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
        scaled.build(model.trainable_variables)
        weight = model.trainable_variables[0]
        print(json.dumps({
            "before": before,
            "after": [compile_with("experimental_run_tf_function"), compile_with("no_such_keyword")],
            "fused": tf.keras.layers.BatchNormalization(axis=1, fused=False)(tf.ones([2, 3]), training=True).shape.as_list(),
            "refs": [weight.ref() == weight.ref(), weight.ref().deref() is weight, weight.ref() in {weight.ref(): 1}, weight.ref() != model.trainable_variables[1].ref()],
            "variables": [len(optimizer.variables()), optimizer.variables() == optimizer.variables, isinstance(optimizer.variables, list),
                          len(distributed.variables()), len(scaled.variables()) == len(scaled.variables)],
        }))
    """)
    assert found["before"][0].startswith("TypeError") and found["before"][1] is False  # nothing changes before hvd.init()
    assert found["after"][0] == "ok"
    assert found["after"][1].startswith("TypeError") and "no_such_keyword" in found["after"][1]
    assert found["variables"] == [6, True, True, 2, True]  # Adam: iterations, learning rate, 2 x (m, v); SGD: the first two
    assert found["fused"] == [2, 3] and found["refs"] == [True, True, True, True]


@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_learning_rate_callbacks_follow_horovods_schedules(keras):
    """Horovod's schedules for a job of 4 ranks (the size the warm-up divides by, faked on one rank):
    the warm-up from initial_lr / 4 to initial_lr over 2 epochs, batch by batch, the epoch counting
    the batch about to run; a staircase schedule at each epoch's first batch; momentum correction
    as Horovod's scaling of the momentum coefficient, here of SGD's momentum slots. On either Keras."""
    found = results_of("""
        import json
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow as hvd_tf
        import horovod.tensorflow.keras as hvd
        hvd.init()
        hvd_tf.size = lambda: 4

        class Recorder(tf.keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.rates, self.velocity = [], []

            def on_train_batch_begin(self, batch, logs=None):
                self.rates.append(round(float(self.model.optimizer.learning_rate), 6))
                momentums = getattr(self.model.optimizer, "momentums", [])
                self.velocity.append(float(np.abs(momentums[0].numpy()).sum()) if momentums else 0.0)

        def fit(schedule, momentum=0.0, nesterov=False):
            tf.keras.utils.set_random_seed(1)
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer=tf.keras.optimizers.SGD(0.4, momentum=momentum, nesterov=nesterov), loss="mse")
            recorder = Recorder()
            data = tf.data.Dataset.from_tensors((tf.ones([4, 2]), tf.ones([4, 1]))).repeat()
            try:
                history = model.fit(data, epochs=3, steps_per_epoch=3, callbacks=[schedule, recorder], verbose=0)
            except Exception as error:
                return f"{type(error).__name__}: {error}"
            return recorder.rates, recorder.velocity, history.history["lr"]

        warmup = fit(hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), momentum=0.0)
        staircase = fit(hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.4, multiplier=0.5, start_epoch=1))
        corrected = fit(hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), momentum=0.9)
        uncorrected = fit(hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2, momentum_correction=False), momentum=0.9)
        nesterov = fit(hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), momentum=0.9, nesterov=True)
        print(json.dumps({"warmup": warmup, "staircase": staircase, "corrected": corrected, "uncorrected": uncorrected, "nesterov": nesterov,
                          "keras": tf.keras.Model.__module__.split(".")[0]}))
    """, keras=keras)
    assert found["keras"] == {3: "keras", 2: "tf_keras"}[keras]
    expected = [round(0.4 / 4 * ((epoch + (batch + 1) / 3) * 3 / 2 + 1), 6) for epoch in range(2) for batch in range(3)]
    rates, _, epoch_logs = found["warmup"]
    assert rates == pytest.approx(expected + [0.4] * 3)
    assert epoch_logs == pytest.approx([expected[2], expected[5], 0.4])
    rates, _, epoch_logs = found["staircase"]
    assert rates == pytest.approx([0.4] * 3 + [0.2] * 3 + [0.1] * 3)  # 0.4 * 0.5 ** epoch from epoch 1
    # The velocity each batch starts with: scaled by new_lr / old_lr with the correction, not without.
    corrected, uncorrected = found["corrected"][1], found["uncorrected"][1]
    assert corrected[0] == uncorrected[0] == 0.0
    assert found["corrected"][0] == found["uncorrected"][0] == pytest.approx(expected + [0.4] * 3)
    assert corrected[1] != pytest.approx(uncorrected[1])
    assert found["nesterov"].startswith("NotSupportedByCaramel: LearningRateWarmupCallback(momentum_correction=True) with SGD(nesterov=True)")


@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_load_model_checkpoints_tapes_and_variable_references_work_as_horovods(tmp_path, keras):
    """hvd.load_model gives the saved model with its optimizer, state and all, as Horovod's
    DistributedOptimizer; BestModelCheckpoint keeps the best model; a tape made to record is a
    tf.GradientTape; vars_to_refs and refs_to_vars go there and back."""
    found = results_of(f"""
        import json
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow as hvd
        import horovod.tensorflow.keras as hk
        hk.init()
        data = tf.data.Dataset.from_tensors((tf.ones([8, 3]), tf.zeros([8, 1]))).repeat()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.build((None, 3))
        model.compile(optimizer=hk.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
        try:
            hk.callbacks.BestModelCheckpoint().on_train_begin()
            no_path = "no error"
        except ValueError as error:
            no_path = str(error)
        best = hk.callbacks.BestModelCheckpoint(monitor="loss", filepath={str(tmp_path / "best.keras")!r})
        model.fit(data, epochs=2, steps_per_epoch=3, callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0), best], verbose=0)
        model.save({str(tmp_path / "saved.keras")!r})
        loaded = hk.load_model({str(tmp_path / "saved.keras")!r})
        state = [np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.optimizer.variables, loaded.optimizer.variables)]
        # Resumed as Horovod's keras_imagenet_resnet50.py resumes: at the epoch it was saved after.
        loaded.fit(data, epochs=3, initial_epoch=2, steps_per_epoch=3, callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)], verbose=0)

        weights = tf.Variable([2.0])
        with hvd.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = weights * weights
        refs = hvd.vars_to_refs([weights, model.trainable_variables[0]])
        print(json.dumps({{
            "no_path": no_path, "best_written": {str(tmp_path / "best.keras")!r} and __import__("os").path.exists({str(tmp_path / "best.keras")!r}),
            "optimizer": [type(loaded.optimizer).__name__, type(loaded.optimizer)._caramel_distributed, all(state), len(state) > 1,
                          int(loaded.optimizer.iterations.numpy())],
            "tape": [isinstance(tape, tf.GradientTape), tape.gradient(loss, [weights])[0].numpy().tolist()],
            "refs": [len({{refs[0], refs[1], hvd.vars_to_refs(weights)}}), hvd.refs_to_vars(refs)[1] is model.trainable_variables[0]],
        }}))
    """, keras=keras)
    assert found["no_path"].startswith("hvd.callbacks.BestModelCheckpoint needs a filepath")
    assert found["best_written"]
    assert found["optimizer"] == ["Adam", True, True, True, 9]  # 6 steps saved, 3 more after loading
    assert found["tape"] == [True, [4.0]]
    assert found["refs"] == [2, True]


# -- the weights check at exit ------------------------------------------------------------------------

TRAIN_A_STEP = """
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    weights = tf.Variable([1.0, 2.0])
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * weights)
        tape = hvd.DistributedGradientTape(tape)
        optimizer.apply_gradients(zip(tape.gradient(loss, [weights]), [weights]))

    step()
"""


def test_a_script_written_for_horovod_ends_with_the_weights_check():
    result = run_one_rank(TRAIN_A_STEP)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(re.findall(r"^caramel: weights digest [0-9a-f]{64}$", result.stderr, re.MULTILINE)) == 1, result.stderr[-3000:]


def test_ranks_that_end_with_different_weights_fail_the_run():
    """The check's gather faked to bring another rank's different digest."""
    result = run_one_rank(TRAIN_A_STEP + """
    from caramel.tensorflow.runtime import current
    current().backend.all_gather = lambda tensor, name: tf.stack([tensor, tensor + 1])
    """)
    assert result.returncode == 1
    assert "caramel: ranks finished with different weights: digest prefixes" in result.stderr


def test_a_failing_script_is_not_held_up_by_the_weights_check():
    """The other ranks may never come to the check: after an uncaught exception there is none."""
    result = run_one_rank(TRAIN_A_STEP + """
    from caramel.tensorflow.runtime import current
    current().backend.all_gather = lambda tensor, name: (_ for _ in ()).throw(AssertionError("the check ran"))
    raise ValueError("the script's own failure")
    """)
    assert result.returncode == 1
    assert "ValueError: the script's own failure" in result.stderr
    assert "the check ran" not in result.stderr and "weights digest" not in result.stderr


# -- end to end: two workers under `caramel run` ---------------------------------------------------------


def run_horovod_job(tmp_path, script: Path | None, args: list[str], command: list[str] | None = None, **spec) -> str:
    """Run a two-worker job in tmp_path (its working directory); its standard error, after success."""
    manifest = job_manifest(
        name="horovod-job", script=str(script) if script else None, command=command, args=args, workingDir=str(tmp_path),
        runPolicy={"backoffLimit": 0}, **spec,
    )  # fmt: skip
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr[-6000:]
    return result.stderr


def assert_ranks_agree(output: str) -> None:
    by_rank = digests(output)
    assert sorted(by_rank) == [0, 1], output[-4000:]
    assert by_rank[0] == by_rank[1]


EXAMPLES = {
    "mnist": (["--steps", "12", "--batch-size", "16"], ["rank 0 | Step #0 "]),
    "keras_mnist": (
        ["--epochs", "3", "--steps-per-epoch", "8", "--batch-size", "16"],
        [
            "rank 0 | Epoch 3: the learning rate warm-up ended at 0.002.", "steps 12/12",
            "caramel: keeping one step per graph, as compiled: LearningRateWarmupCallback's on_train_batch_begin act on single batches",
        ],
    ),
    "synthetic_benchmark": (
        ["--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
         "--num-iters", "2"],
        ["rank 0 | Total img/sec on 2 GPU(s): "],
    ),
    "keras_synthetic_benchmark": (
        ["--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4", "--num-batches-per-iter", "2", "--num-iters", "2"],
        ["rank 0 | Total img/sec on 2 GPU(s): ", "steps 4/4", "caramel: 2 steps per graph (compile gave steps_per_execution 1"],
    ),
}  # fmt: skip


@pytest.mark.e2e
@needs_horovod
@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_a_script_in_the_shape_of_horovods_example_runs_unchanged(tmp_path, example, keras):
    """On Keras 3, and on Keras 2 (tf-keras), which the job asks for as Horovod's users do."""
    args, expected_lines = EXAMPLES[example]
    output = run_horovod_job(tmp_path, HOROVOD_EXAMPLES / f"{example}.py", args, env=keras_env(keras))
    assert "caramel: 2 ranks on the horovod backend (spec.caramel.backend: auto); tf.keras is Keras " + str(keras) in output
    for line in expected_lines:
        assert line in output, output[-4000:]
    assert_ranks_agree(output)
    if example == "mnist":
        assert (tmp_path / "checkpoints-1.index").is_file()
    if example == "keras_mnist":
        assert sorted(path.name for path in tmp_path.glob("checkpoint-*.h5")) == ["checkpoint-1.h5", "checkpoint-2.h5", "checkpoint-3.h5"]


COLLECTIVES = """
import json
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
r = hvd.rank()
sparse = hvd.allreduce(tf.IndexedSlices(tf.constant([[1.0 + r]]), tf.constant([r]), tf.constant([2, 1])))

# A local source keeps its own gradient, divided by the ranks' number; the others are averaged.
shared, own = tf.Variable([1.0]), tf.Variable([1.0])
with tf.GradientTape() as tape:
    loss = (r + 1.0) * (shared[0] + own[0])
tape = hvd.DistributedGradientTape(tape)
tape.register_local_source(own)
(local,), (averaged,) = tape.get_local_and_global_gradients(loss, [shared, own], use_generic_names=True)
local_source = [local[0] is own, float(local[1][0]) == (r + 1) / 2, averaged[0] is shared, float(averaged[1][0]) == 1.5,
                isinstance(tape, tf.GradientTape)]

# Batch normalization with the statistics of both ranks' batches together.
everything = tf.random.stateless_normal([2, 4, 3], seed=[1, 2])
layer = hvd.SyncBatchNormalization()
normalized = layer(everything[r], training=True)
mean, variance = tf.reduce_mean(everything, axis=[0, 1]), tf.math.reduce_variance(everything, axis=[0, 1])
expected = (everything[r] - mean) / tf.sqrt(variance + layer.epsilon)
sync_batch_norm = [bool(tf.reduce_max(tf.abs(normalized - expected)) < 1e-5),
                   bool(tf.reduce_max(tf.abs(layer.moving_mean - (1 - layer.momentum) * mean)) < 1e-6)]

# Every variable of the process takes rank 1's value.
mine = tf.Variable([float(r), 10.0 * r])
hvd.broadcast_global_variables(1)
print(json.dumps({
    "local_source": local_source, "sync_batch_norm": sync_batch_norm, "global_variables": mine.numpy().tolist(),
    "shared_after_broadcast": shared.numpy().tolist(),
    "grouped_allreduce": [t.numpy().tolist() for t in hvd.grouped_allreduce(
        [tf.constant([1.0 + r])], None, "", "", hvd.Compression.none, hvd.Sum, 1.0, 1.0, hvd.global_process_set, True, "named")],
    "allgather": hvd.allgather(tf.fill([r + 1, 2], r)).numpy().tolist(),
    "allgather_uint8": hvd.allgather(tf.zeros([0 if r == 0 else 2], tf.uint8) + r).numpy().tolist(),
    "allgather_in_graph": tf.function(hvd.allgather)(tf.fill([r + 2], float(r))).numpy().tolist(),
    "broadcast_object": hvd.broadcast_object({"from": r, "text": "x" * (r + 3)} if r == 1 else None, root_rank=1),
    "allgather_object": hvd.allgather_object(("rank", r, list(range(r)))),
    "sum": hvd.allreduce(tf.constant([1.0, float(r)]), op=hvd.Sum).numpy().tolist(),
    "average": hvd.allreduce(tf.constant([2.0 * r])).numpy().tolist(),
    "max": hvd.allreduce(tf.constant([r]), op=hvd.Max).numpy().tolist(),
    "broadcast": hvd.broadcast(tf.constant([r, 10 + r]), root_rank=1).numpy().tolist(),
    "sparse": [sparse.values.numpy().tolist(), sparse.indices.numpy().tolist()],
}), flush=True)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["horovod", "tensorflow"])
def test_collectives_across_two_ranks(tmp_path, backend):
    if backend == "horovod" and not horovod_installed():
        pytest.skip("Horovod is not installed (make setup builds it)")
    output = run_horovod_job(tmp_path, None, [], command=[sys.executable, "-c", COLLECTIVES], caramel={"backend": backend})
    by_rank = {int(rank): json.loads(line) for rank, line in re.findall(r"^rank (\d) \| (\{.*\})$", output, re.MULTILINE)}
    expected = {
        "allgather": [[0, 0], [1, 1], [1, 1]], "allgather_uint8": [1, 1], "allgather_in_graph": [0.0, 0.0, 1.0, 1.0, 1.0],
        "broadcast_object": {"from": 1, "text": "xxxx"}, "allgather_object": [["rank", 0, []], ["rank", 1, [0]]],
        "sum": [2.0, 1.0], "average": [1.0], "max": [1], "broadcast": [1, 11], "sparse": [[[0.5], [1.0]], [0, 1]],
        "local_source": [True] * 5, "sync_batch_norm": [True, True], "global_variables": [1.0, 10.0], "shared_after_broadcast": [1.0],
        "grouped_allreduce": [[3.0]],
    }  # fmt: skip
    assert by_rank == {0: expected, 1: expected}, output[-4000:]


HOROVODS_OWN_OPS = """
import json
import sys
import tensorflow as tf
import horovod.tensorflow as hvd

if sys.argv[1] == "refused":  # the tensorflow backend: each refused by name
    refused = []
    for call in (lambda: hvd.init(process_sets=[hvd.ProcessSet([0])]), hvd.init, lambda: hvd.alltoall(tf.constant([1.0, 2.0])),
                 lambda: hvd.reducescatter(tf.constant([1.0, 2.0])), lambda: hvd.grouped_reducescatter([tf.constant([1.0])]),
                 hvd.join, lambda: hvd.allreduce(tf.constant([1.0]), op=hvd.Product), lambda: hvd.add_process_set([0]),
                 lambda: hvd.size_op(1)):
        try:
            call()
        except hvd.NotSupportedByCaramel as error:
            refused.append(str(error).split(" is not supported by Caramel")[0])
    print(json.dumps({"refused": refused}), flush=True)
    raise SystemExit
if sys.argv[1] == "dynamic":  # a process set added once Horovod started, then removed
    hvd.init(process_sets="dynamic")
    second = hvd.add_process_set([1])
    summed = hvd.allreduce(tf.constant([5.0]), op=hvd.Sum, process_set=second).numpy().tolist() if hvd.rank() == 1 else None
    print(json.dumps({"dynamic": [second.size(), summed, hvd.remove_process_set(second)]}), flush=True)
    raise SystemExit
alone = hvd.ProcessSet([0]), hvd.ProcessSet([1])
hvd.init(process_sets=list(alone))
r = hvd.rank()
mine = alone[r]
x = tf.constant([1.0 + r, 10.0 + r])


@tf.function
def in_graph(x):
    return hvd.alltoall(x), hvd.reducescatter(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Product), hvd.allreduce(x, process_set=mine)


collected, received = hvd.alltoall(tf.range(3 * (r + 1)), splits=[r + 1, 2 * (r + 1)])
print(json.dumps({
    "set": [mine.size(), mine.rank(), mine.included()],
    "alltoall": [collected.numpy().tolist(), received.numpy().tolist()],
    "reducescatter": hvd.reducescatter(x, op=hvd.Sum).numpy().tolist(),
    "grouped_reducescatter": [t.numpy().tolist() for t in hvd.grouped_reducescatter([x, 2 * x])],
    "product": hvd.allreduce(x, op=hvd.Product).numpy().tolist(),
    "grouped_product": [t.numpy().tolist() for t in hvd.grouped_allreduce([x], op=hvd.Product)],
    "set_allreduce": hvd.allreduce(x, process_set=mine).numpy().tolist(),
    "set_allgather": hvd.allgather(x, process_set=mine).numpy().tolist(),
    "set_broadcast": hvd.broadcast(x, r, process_set=mine).numpy().tolist(),
    "set_ops": [int(hvd.size_op(mine.process_set_id)), int(hvd.process_set_included_op(alone[0].process_set_id))],
    "in_graph": [t.numpy().tolist() for t in in_graph(x)],
    "join": int(hvd.join()),
}), flush=True)
"""


def rank_lines(output: str) -> dict[int, dict]:
    """Each rank's JSON line."""
    return {int(rank): json.loads(line) for rank, line in re.findall(r"^rank (\d) \| (\{.*\})$", output, re.MULTILINE)}


@pytest.mark.e2e
@needs_horovod
def test_horovods_own_ops_and_process_sets_pass_through_on_the_horovod_backend(tmp_path):
    """alltoall, reducescatter, join, Product and process sets (each rank its own set here) are
    Horovod's ops, eagerly and in a graph."""
    output = run_horovod_job(tmp_path, None, [], command=[sys.executable, "-c", HOROVODS_OWN_OPS, "static"])
    lines = rank_lines(output)
    # join returns the rank that joined last, as Horovod's does: either, the same on both.
    joined = {rank: line.pop("join") for rank, line in lines.items()}
    assert joined[0] == joined[1] and joined[0] in (0, 1), output[-4000:]
    product = [2.0, 110.0]
    common = {"set": [1, 0, True], "product": product, "grouped_product": [product]}
    assert lines == {
        0: {**common, "alltoall": [[0, 0, 1], [1, 2]], "reducescatter": [3.0], "grouped_reducescatter": [[1.5], [3.0]],
            "set_allreduce": [1.0, 10.0], "set_allgather": [1.0, 10.0], "set_broadcast": [1.0, 10.0], "set_ops": [1, 1],
            "in_graph": [[1.0, 2.0], [3.0], product, [1.0, 10.0]]},
        1: {**common, "alltoall": [[1, 2, 2, 3, 4, 5], [2, 4]], "reducescatter": [21.0], "grouped_reducescatter": [[10.5], [21.0]],
            "set_allreduce": [2.0, 11.0], "set_allgather": [2.0, 11.0], "set_broadcast": [2.0, 11.0], "set_ops": [1, 0],
            "in_graph": [[10.0, 11.0], [21.0], product, [2.0, 11.0]]},
    }, output[-4000:]  # fmt: skip


@pytest.mark.e2e
@needs_horovod
def test_a_process_set_added_after_init_passes_through_with_dynamic_process_sets(tmp_path):
    output = run_horovod_job(tmp_path, None, [], command=[sys.executable, "-c", HOROVODS_OWN_OPS, "dynamic"])
    assert rank_lines(output) == {0: {"dynamic": [1, None, True]}, 1: {"dynamic": [1, [5.0], True]}}, output[-4000:]


@pytest.mark.e2e
def test_the_tensorflow_backend_refuses_horovods_own_ops_by_name(tmp_path):
    output = run_horovod_job(tmp_path, None, [], command=[sys.executable, "-c", HOROVODS_OWN_OPS, "refused"], caramel={"backend": "tensorflow"})
    refused = ["hvd.init(process_sets=...)", "hvd.alltoall", "hvd.reducescatter", "hvd.grouped_reducescatter", "hvd.join",
               "hvd.allreduce(op=Product)", "hvd.add_process_set", "hvd.size_op(process_set_id=1)"]  # fmt: skip
    assert rank_lines(output) == {0: {"refused": refused}, 1: {"refused": refused}}, output[-4000:]


PARTIAL = """
import json
import tensorflow as tf
import horovod.keras as hvd
hvd.init()
r = hvd.rank()
shared, own = tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)
model = tf.keras.Sequential([shared, own])
model.build((None, 3))
model.compile(optimizer=hvd.PartialDistributedOptimizer(tf.keras.optimizers.SGD(0.1), local_layers=[own]), loss="mse")
data = tf.data.Dataset.from_tensors((tf.fill([8, 3], 1.0 + r), tf.fill([8, 1], 5.0 * r))).repeat()
model.fit(data, epochs=1, steps_per_epoch=4, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)], verbose=0)
print(json.dumps({"shared": shared.kernel.numpy().sum().item(), "own": own.kernel.numpy().sum().item()}), flush=True)
"""


@pytest.mark.e2e
def test_a_partial_optimizer_averages_all_but_its_local_layers(tmp_path):
    """horovod.keras.PartialDistributedOptimizer: the local layer trains on each rank's own
    gradients (the ranks' data differ, so it ends apart), the rest as one; the run's check that the
    ranks end alike leaves the local layer out."""
    output = run_horovod_job(tmp_path, None, [], command=[sys.executable, "-c", PARTIAL], caramel={"backend": "tensorflow"})
    by_rank = {int(rank): json.loads(line) for rank, line in re.findall(r"^rank (\d) \| (\{.*\})$", output, re.MULTILINE)}
    assert by_rank[0]["shared"] == pytest.approx(by_rank[1]["shared"], abs=1e-6), output[-3000:]
    assert abs(by_rank[0]["own"] - by_rank[1]["own"]) > 1e-3, by_rank
    assert_ranks_agree(output)


# -- end to end: Horovod-shaped training is synchronous SGD -------------------------------------------------

RANKS, BATCH, HIDDEN, LEARNING_RATE, MOMENTUM = 2, 16, 32, 0.05, 0.9


def synchronous_sgd(api: str, epochs: int, steps_per_epoch: int, warmup_epochs: int, passes: int = 1) -> list[np.ndarray]:
    """What Horovod's semantics give, in this process: SGD with momentum on the average of the ranks'
    gradients (the gradient of the global batch's mean loss), written out here rather than through
    Keras' optimizer. Each rank starts from weights of its own (seed SEED + rank). The tape
    script takes rank 0's variables after its first step, whose gradients each rank computed at
    its own weights; the Keras script takes them before training, and warms the learning rate up
    batch by batch with Horovod's momentum correction (the coefficient times new / old rate for
    that batch, which is the velocity scaled so). With `passes` above 1 (Horovod's
    backward_passes_per_step), the gradients of that many passes at unchanged weights are summed,
    and the update of their average over the ranks comes every that many passes."""
    from testbed.small_model import LOSS, SEED, batch, build_model

    models = []
    for rank in range(RANKS):
        tf.keras.utils.set_random_seed(SEED + rank)
        models.append(build_model(HIDDEN))
    weights = [variable.numpy() for variable in models[0].trainable_variables]
    velocity = [np.zeros_like(weight) for weight in weights]
    totals = [np.zeros_like(weight) for weight in weights]
    rate = LEARNING_RATE
    for epoch in range(epochs):
        for index in range(steps_per_epoch):
            step = epoch * steps_per_epoch + index + 1
            if epoch < warmup_epochs:
                new = LEARNING_RATE / RANKS * ((epoch + (index + 1) / steps_per_epoch) * (RANKS - 1) / warmup_epochs + 1)
                velocity, rate = [v * (new / rate) for v in velocity], new
            gradients = []
            for rank, model in enumerate(models):
                if not (api == "tape" and step == 1):  # after the tape's first step, every rank holds rank 0's weights
                    for variable, weight in zip(model.trainable_variables, weights):
                        variable.assign(weight)
                features, labels = batch(tf.constant(step, tf.int64), rank, BATCH)
                with tf.GradientTape() as tape:
                    loss = LOSS(labels, model(features, training=True))
                gradients.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
            totals = [total + np.mean(per_rank, axis=0) for total, per_rank in zip(totals, zip(*gradients))]
            if step % passes == 0:
                velocity = [MOMENTUM * v - rate * total for v, total in zip(velocity, totals)]
                weights = [weight + v for weight, v in zip(weights, velocity)]
                totals = [np.zeros_like(weight) for weight in weights]
    return weights


SGD_RUNS = {
    "tape": {"api": "tape", "epochs": 1, "steps_per_epoch": 12, "warmup_epochs": 0},
    "keras": {"api": "keras", "epochs": 3, "steps_per_epoch": 4, "warmup_epochs": 2},
    # Three passes per update, two steps per execution: an update's passes straddle executions.
    "keras-accumulating": {"api": "keras", "epochs": 2, "steps_per_epoch": 6, "warmup_epochs": 0, "passes": 3, "steps_per_execution": 2},
}


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["horovod", "tensorflow"])
@pytest.mark.parametrize("name", list(SGD_RUNS))
def test_horovod_shaped_training_is_synchronous_sgd(tmp_path, name, backend):
    if backend == "horovod" and not horovod_installed():
        pytest.skip("Horovod is not installed (make setup builds it)")
    run = SGD_RUNS[name]
    saved = tmp_path / "weights.npz"
    command = [
        sys.executable, "-m", "testbed.horovod_sgd_worker", "--api", run["api"], "--epochs", str(run["epochs"]),
        "--steps-per-epoch", str(run["steps_per_epoch"]), "--warmup-epochs", str(run["warmup_epochs"]), "--batch-size", str(BATCH),
        "--hidden", str(HIDDEN), "--learning-rate", str(LEARNING_RATE), "--output", str(saved),
        "--backward-passes", str(run.get("passes", 1)), "--steps-per-execution", str(run.get("steps_per_execution", 1)),
    ]  # fmt: skip
    manifest = job_manifest(name="horovod-sgd", script=None, command=command, args=[], caramel={"backend": backend}, runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr[-6000:]
    assert f"caramel: 2 ranks on the {backend} backend" in result.stderr
    assert_ranks_agree(result.stderr)
    loaded = np.load(saved)
    actual = [loaded[f"arr_{i}"] for i in range(len(loaded.files))]
    expected = synchronous_sgd(run["api"], run["epochs"], run["steps_per_epoch"], run["warmup_epochs"], run.get("passes", 1))
    assert len(actual) == len(expected) == 6
    for index, (weight, wanted) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(weight, wanted, rtol=1e-5, atol=1e-6, err_msg=f"trainable variable {index}")


@pytest.mark.e2e
@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_a_model_built_by_its_first_batch_trains_alike_on_every_rank(tmp_path, keras):
    """A Sequential without an input shape under Horovod's Keras API, two steps per execution:
    Keras' own first execution builds it (its gradients averaged), every rank takes rank 0's
    variables after it, as Horovod's callback broadcasts after the first batch, and Caramel's steps
    run the rest: the ranks end alike, every step run."""
    command = [
        sys.executable, "-m", "testbed.horovod_sgd_worker", "--api", "keras", "--unbuilt", "--epochs", "2", "--steps-per-epoch", "4",
        "--steps-per-execution", "2", "--output", str(tmp_path / "weights.npz"),
    ]  # fmt: skip
    manifest = job_manifest(name="first-batch", script=None, command=command, args=[], env=keras_env(keras), runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))  # from the repository, where testbed is
    assert result.returncode == 0, result.stderr[-6000:]
    output = result.stderr
    assert_ranks_agree(output)
    assert sorted(re.findall(r"^rank (\d) \| iterations (\d+)$", output, re.MULTILINE)) == [("0", "8"), ("1", "8")], output[-3000:]
