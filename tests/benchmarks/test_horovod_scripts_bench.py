"""The Horovod-shaped scripts' benchmark (benchmarks/horovod_scripts_bench.py) and its baseline, the
plain-Horovod runner (benchmarks/plain_horovod_runner.py).

Unit tests: the runner's path and module surgery and its refusals, the bench's reading of each
script's output, its steady step, its tables and ratios (made-up timings), and the jobs it writes.
End to end (marked e2e): the runner under `caramel run` with two workers runs the real Horovod, in
Keras 2, on a small script using Horovod's Keras layer and its TF2 tape.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

import benchmarks.horovod_scripts_bench as bench
import benchmarks.plain_horovod_runner as runner
from caramel.contract.cpus import machine_cpus, pool_sizes
from caramel.contract.jobfile import parse_job
from caramel.launch.entrypoint import HOROVOD_API_DIR
from conftest import REPO, job_manifest, run_caramel, write_manifest

# -- the runner ---------------------------------------------------------------------------------


def test_the_runner_takes_caramels_horovod_off_the_path_and_forgets_its_modules(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "horovod").mkdir(parents=True)
    (elsewhere / "horovod" / "_caramel_support.py").write_text("")  # another copy of Caramel's package
    path = [str(REPO), HOROVOD_API_DIR, "/usr/lib/python3.11", str(elsewhere)]
    environ = {"PYTHONPATH": os.pathsep.join([HOROVOD_API_DIR, str(REPO)])}
    modules = {"horovod": 1, "horovod.tensorflow": 2, "horovodrun_like": 3, "json": 4}
    removed = runner.drop_caramels_horovod(path, environ, modules)
    assert removed == [HOROVOD_API_DIR, str(elsewhere)]
    assert path == [str(REPO), "/usr/lib/python3.11"]
    assert environ == {"PYTHONPATH": str(REPO)}
    assert sorted(modules) == ["horovodrun_like", "json"]

    environ = {"PYTHONPATH": HOROVOD_API_DIR}
    runner.drop_caramels_horovod([], environ, {})
    assert environ == {}


def test_the_runner_sets_up_keras_2_before_tensorflow_and_only_then():
    environ: dict[str, str] = {}
    meta_path: list[object] = []
    if importlib.util.find_spec("tf_keras") is None:
        with pytest.raises(RuntimeError, match="tf-keras .* is not installed"):
            runner.use_keras_2(environ, {}, meta_path)
        return
    runner.use_keras_2(environ, {}, meta_path)
    runner.use_keras_2(environ, {}, meta_path)
    assert environ == {"TF_USE_LEGACY_KERAS": "1"}
    assert len(meta_path) == 1 and isinstance(meta_path[0], runner.KerasIsTfKeras)
    finder = meta_path[0]
    assert finder.find_spec("keras.backend", None).name == "keras.backend"
    assert finder.find_spec("kerastuner", None) is None and finder.find_spec("tf_keras", None) is None
    for imported in ({"tensorflow": 1}, {"keras": 1}, {"keras.src": 1}):
        with pytest.raises(RuntimeError, match="imported before the runner"):
            runner.use_keras_2({}, imported, [])


def test_the_runner_refuses_no_script_or_a_missing_one(capsys, tmp_path):
    for argv in ([], ["--help"], [str(tmp_path / "missing.py")]):
        with pytest.raises(SystemExit) as exited:
            runner.main(argv)
        assert exited.value.code == 2
    assert "missing.py' is not a file" in capsys.readouterr().err


# -- reading the scripts' output -----------------------------------------------------------------


def stamped(*lines: str, every: float = 1.0) -> list[tuple[float, str]]:
    return [(index * every, line) for index, line in enumerate(lines)]


def test_iterations_are_timed_by_the_scripts_own_images_per_second():
    script = bench.SCRIPTS["synthetic_benchmark"]
    args = ["--batch-size", "16", "--num-batches-per-iter", "10", "--num-iters", "4"]
    lines = stamped(
        "rank 0 | Running benchmark...",
        "rank 0 | Iter #0: 80.0 img/sec per CPU",  # 2 s for 10 steps
        "rank 1 | Iter #0: 10.0 img/sec per CPU",  # another rank's: not read
        "rank 0 | Iter #1: 160.0 img/sec per CPU",  # 1 s
        "rank 0 | Iter #2: 160.0 img/sec per CPU",
        "rank 0 | Iter #3: 100.0 img/sec per CPU",  # 1.6 s
    )
    points = bench.progress_points(script, args, 2, lines)
    assert [steps for _, steps in points] == [0, 10, 20, 30, 40]
    assert [seconds for seconds, _ in points] == pytest.approx([0.0, 2.0, 3.0, 4.0, 5.6])
    step, steps = bench.steady_step(points)  # from 10 steps on (a quarter of 40)
    assert steps == 30 and step == pytest.approx(3.6 / 30)


def test_steps_are_timed_by_the_arrival_of_their_lines():
    script = bench.SCRIPTS["mnist"]
    lines = [(5.0, "rank 0 | Step #0\tLoss: 2.3"), (5.1, "rank 1 | Step #0\tLoss: 2.3"), (9.0, "rank 0 | Step #10\tLoss: 1.2"),
             (10.0, "rank 0 | Step #20\tLoss: 0.9"), (11.0, "rank 0 | Step #30\tLoss: 0.5"), (11.5, "rank 0 | caramel: done")]  # fmt: skip
    points = bench.progress_points(script, ["--steps", "80"], 2, lines)
    assert points == [(5.0, 1), (9.0, 11), (10.0, 21), (11.0, 31)]
    assert bench.steady_step(points) == (pytest.approx(2.0 / 20), 20)  # 11 steps done is past a quarter of 31


def test_epochs_are_timed_by_the_arrival_of_keras_epoch_lines():
    script = bench.SCRIPTS["keras_mnist"]
    lines = [(3.0, "rank 0 | Epoch 1/4"), (9.0, "rank 0 | 50/50 [====] - 6s 120ms/step - loss: 2.2"), (9.1, "rank 0 | Epoch 2/4"),
             (14.1, "rank 0 | Epoch 3/4"), (19.1, "rank 0 | Epoch 4/4"), (19.2, "rank 0 | Epoch 4: finished gradual learning rate warmup")]  # fmt: skip
    points = bench.progress_points(script, ["--epochs", "4", "--steps-per-epoch", "100"], 2, lines)
    assert points == [(3.0, 0), (9.1, 50), (14.1, 100), (19.1, 150)]
    assert bench.steady_step(points) == (pytest.approx(10.0 / 100), 100)


def test_no_steady_step_without_two_points():
    assert bench.steady_step([]) == (None, 0)
    assert bench.steady_step([(1.0, 10)]) == (None, 0)
    assert bench.steady_step([(1.0, 10), (2.0, 10)]) == (None, 0)
    assert bench.steady_step([(1.0, 10), (3.0, 30)]) == (pytest.approx(0.1), 20)


# -- tables and ratios ----------------------------------------------------------------------------


def made_up_runs() -> list[bench.Run]:
    """mnist, 3 repeats: Horovod 100, 110, 90 ms; caramel-horovod 95, 99, 99 ms; caramel-tensorflow
    failed once; caramel-horovod-keras2 80, 88, 72 ms."""
    runs = []
    timings = {
        "horovod": [(0.100, 30.0, 800.0), (0.110, 32.0, 810.0), (0.090, 28.0, 790.0)],
        "caramel-horovod": [(0.095, 33.0, 880.0), (0.099, 32.0, 900.0), (0.099, 30.8, 870.0)],
        "caramel-tensorflow": [(0.120, 36.0, 900.0), None, (0.117, 35.0, 950.0)],
        "caramel-horovod-keras2": [(0.080, 27.0, 700.0), (0.088, 29.0, 710.0), (0.072, 25.0, 690.0)],
    }
    for variant, rows in timings.items():
        for repeat, row in enumerate(rows):
            if row is None:
                runs.append(bench.Run("mnist", variant, repeat, error="caramel run exited 1; its output ends:\nboom"))
                continue
            step, wall, rss = row
            runs.append(bench.Run("mnist", variant, repeat, wall, step, 100, {"0": rss, "1": rss - 50}))
    return runs


def test_ratios_are_of_the_medians_with_the_per_repeat_ratios_as_spread():
    runs = made_up_runs()
    ratio = bench.ratio(runs, "caramel-horovod", "step_seconds")
    assert ratio.of_medians == pytest.approx(0.099 / 0.100)
    assert (ratio.low, ratio.high, ratio.pairs) == (pytest.approx(0.099 / 0.110), pytest.approx(0.099 / 0.090), 3)
    wall = bench.ratio(runs, "caramel-horovod", "wall_seconds")
    assert wall.of_medians == pytest.approx(32.0 / 30.0)
    assert (wall.low, wall.high) == (pytest.approx(1.0), pytest.approx(1.1))
    failed_once = bench.ratio(runs, "caramel-tensorflow", "step_seconds")  # repeats 0 and 2 only
    assert failed_once.of_medians == pytest.approx(((0.120 + 0.117) / 2) / 0.100)
    assert (failed_once.low, failed_once.high, failed_once.pairs) == (pytest.approx(1.2), pytest.approx(1.3), 2)
    assert bench.ratio([run for run in runs if run.variant != "horovod"], "caramel-horovod", "step_seconds") is None


def test_the_table_and_summary_line():
    runs = made_up_runs()
    rows = bench.summarize(runs, "mnist")
    assert rows["caramel-tensorflow"]["failed"] == 1
    assert rows["horovod"]["rss"] == bench.Spread(800.0, 790.0, 810.0)  # the largest rank's
    assert rows["caramel-horovod"]["rss_ratio"] == pytest.approx(880.0 / 800.0)
    lines = bench.table(runs, bench.SCRIPTS["mnist"], ["--steps", "1200"])
    assert lines[0].startswith("mnist (--steps 1200): steady step from its Step lines' arrival, after the first 25% of its steps")
    assert lines[3] == "| horovod | 3 | 100.0 (90.0-110.0) |  | 30.0 (28.0-32.0) |  | 800 (790-810) |  |"
    assert lines[4] == "| caramel-horovod | 3 | 99.0 (95.0-99.0) | 0.990x [0.900-1.100] | 32.0 (30.8-33.0) | 1.067x [1.000-1.100] | 880 (870-900) | 1.10x |"
    assert lines[5].startswith("| caramel-tensorflow | 3 (1 failed) | 118.5 (117.0-120.0) | 1.185x [1.200-1.300] |")
    assert lines[6].startswith("| caramel-horovod-keras2 | 3 | 80.0 (72.0-88.0) | 0.800x [0.800-0.800] |")
    assert bench.summary_line(runs, "mnist") == (
        "mnist caramel_horovod_step_over_horovod=0.990 caramel_horovod_run_over_horovod=1.067 "
        "caramel_tensorflow_step_over_horovod=1.185 caramel_tensorflow_run_over_horovod=1.183 "
        "caramel_horovod_keras2_step_over_horovod=0.800 caramel_horovod_keras2_run_over_horovod=0.900"
    )


def test_a_report_from_results_json_names_the_failures(tmp_path):
    from dataclasses import asdict

    document = {"scripts": {"mnist": ["--steps", "1200"]}, "runs": [asdict(run) for run in made_up_runs()], "workers": 2,
                "repeats": 3, "commit": "abc1234"}  # fmt: skip
    lines = bench.report_lines(json.loads(json.dumps(document)))
    assert "  caramel-tensorflow run 2 failed: caramel run exited 1; its output ends: (log )" in lines
    assert lines[-1].startswith("mnist caramel_horovod_step_over_horovod=0.990")
    pytest.importorskip("matplotlib")
    bench.plot(document, tmp_path / "ratios.png")
    assert (tmp_path / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_poller_names_other_benchmarks_beside_a_run_but_not_the_runs_own_processes():
    import subprocess

    import psutil

    sleeper = "import subprocess, sys, time; {} time.sleep(30)"
    child = "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', '-m', 'benchmarks.child']);"
    run = subprocess.Popen([sys.executable, "-c", sleeper.format(child)])
    other = subprocess.Popen([sys.executable, "-c", sleeper.format(""), "-m", "benchmarks.other_bench"])
    try:
        memory = bench.PeakMemory(run.pid)
        memory.start()
        deadline = time.monotonic() + 20
        while other.pid not in memory.others and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * bench.RSS_POLL_SECONDS * bench.OTHERS_EVERY_POLLS)  # the run's child listed by then
        assert memory.stop() == {}  # no training process (a child of the worker entrypoint) among them
        assert memory.others[other.pid].endswith("-m benchmarks.other_bench")
        children = psutil.Process(run.pid).children()
        assert len(children) == 1 and children[0].pid not in memory.others  # the run's own
        assert os.getpid() not in memory.others  # nor this process (the driver)
    finally:
        for process in (run, other):
            process.kill()
            process.wait()


def test_a_run_without_steady_timing_counts_for_wall_time_only():
    runs = [bench.Run("keras_mnist", "horovod", 0, 20.0, None), bench.Run("keras_mnist", "caramel-horovod", 0, 19.0, None)]
    assert bench.ratio(runs, "caramel-horovod", "step_seconds") is None
    assert bench.ratio(runs, "caramel-horovod", "wall_seconds").of_medians == pytest.approx(0.95)
    assert "| caramel-horovod | 1 | - | - | 19.0 (19.0-19.0) | 0.950x [0.950-0.950] | - |  |" in bench.table(runs, bench.SCRIPTS["keras_mnist"], [])


# -- the jobs ---------------------------------------------------------------------------------------


def test_every_variant_runs_the_same_script_the_same_way_but_for_horovod_and_the_backend(tmp_path):
    script = bench.SCRIPTS["mnist"]
    jobs = {variant: bench.job_document(script, variant, script.args, 2, tmp_path, None, python="/venv/python") for variant in bench.VARIANTS}
    for variant, document in jobs.items():
        job = parse_job(document, source=variant)  # a valid CaramelJob
        assert job.spec.args == list(script.args) and job.spec.working_dir == str(tmp_path)
        assert job.spec.workers.replicas == 2 and job.spec.run_policy.backoff_limit == 0
        keras_2 = {("TF_USE_LEGACY_KERAS", "1")} if variant.endswith("-keras2") else set()
        pools = pool_sizes(machine_cpus(), 2)  # the control's: Caramel's sizes for 2 workers on this machine
        sized = {("TF_NUM_INTRAOP_THREADS", str(pools.intra_op)), ("TF_NUM_INTEROP_THREADS", str(pools.inter_op))} if variant == "horovod-sized-pools" else set()
        # The baseline keeps TensorFlow's own pools, which Caramel's worker would size otherwise.
        own = {("TF_NUM_INTRAOP_THREADS", "0"), ("TF_NUM_INTEROP_THREADS", "0")} if variant == "horovod" else set()
        assert {(env.name, env.value) for env in job.spec.env} == {("PYTHONUNBUFFERED", "1"), ("PYTHONPATH", str(REPO))} | keras_2 | sized | own
    for plain in ("horovod", "horovod-sized-pools"):
        assert jobs[plain]["spec"]["command"] == ["/venv/python", "-m", "benchmarks.plain_horovod_runner", str(script.path)]
        assert "script" not in jobs[plain]["spec"] and "caramel" not in jobs[plain]["spec"]
    for variant, backend in bench.BACKENDS.items():
        assert jobs[variant]["spec"]["script"] == str(script.path) and jobs[variant]["spec"]["caramel"] == {"backend": backend}
    assert script.path.is_file()


def test_every_scripts_arguments_parse_and_leave_steps_to_time():
    for script in bench.SCRIPTS.values():
        assert script.path.is_file()
        for args in (script.args, script.smoke_args):
            if script.timing == "epochs":
                assert bench.argument(args, "--epochs", 0) >= 3  # the first epoch and the last are not timed
            if script.timing == "iterations":
                assert bench.argument(args, "--num-iters", 0) >= 2
                assert "--no-cuda" in args  # else keras_synthetic_benchmark calls hvd.sycl_built(), not in Horovod 0.28.1


def test_variants_rotate_over_the_repeats_and_horovod_always_runs(capsys):
    assert [bench.rotated(bench.VARIANTS, repeat)[0] for repeat in range(7)] == [
        "horovod", "horovod-sized-pools", "caramel-horovod", "caramel-tensorflow", "caramel-horovod-keras2", "caramel-tensorflow-keras2", "horovod",
    ]
    assert bench.parse_args(["--variants", "caramel-tensorflow"]).variants == ["horovod", "caramel-tensorflow"]
    assert bench.parse_args([]).scripts == list(bench.SCRIPTS)
    for argv, message in ((["--scripts", "mnist,resnet"], "--scripts: unknown resnet (known: synthetic_benchmark,"),
                          (["--variants", "mirrored"], "--variants: unknown mirrored"), (["--repeats", "0"], "at least 1")):  # fmt: skip
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_tf_keras_is_pinned_to_the_tensorflow_release_and_installed_without_dependencies():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    tensorflow = next(dep for dep in pyproject["project"]["dependencies"] if dep.startswith("tensorflow"))
    assert pyproject["tool"]["caramel"]["without-dependencies"] == [f"tf-keras=={tensorflow.split('==')[1]}"]
    assert "--no-deps $(WITHOUT_DEPENDENCIES)" in (REPO / "Makefile").read_text()
    assert "pip install --no-cache-dir --no-deps -r /opt/caramel/without-dependencies.txt" in (REPO / "Dockerfile").read_text()


# -- end to end: the runner is plain Horovod ---------------------------------------------------------

PROBE = """
import hashlib, json, sys
import numpy as np
import tensorflow as tf
import keras
from keras import backend as K
import horovod
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

hvd.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)), tf.keras.layers.Dense(1)])
model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)))
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
history = model.fit(x, y, batch_size=4, epochs=2, callbacks=callbacks, verbose=0)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
tape = hvd_tf.DistributedGradientTape(tape)
tf.keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
print("PROBE " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(),
    "modules": {name: getattr(module, "__file__", None) for name, module in sys.modules.items() if name.split(".")[0] == "horovod"},
    "keras": keras.__version__, "keras_is_tf_keras": keras.__name__ == "tf_keras", "K_constant": hasattr(K, "constant"),
    "tf_keras_model": tf.keras.Model.__module__, "same_dense": tf.keras.layers.Dense is keras.layers.Dense,
    "legacy_env": __import__("os").environ.get("TF_USE_LEGACY_KERAS"), "argv": sys.argv[1:], "path0": sys.path[0],
    "loss_averaged": float(history.history["loss"][-1]),
    "weights": hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.trainable_variables)).hexdigest(),
}), flush=True)
"""


def horovod_and_keras_2_installed() -> bool:
    from importlib.machinery import PathFinder

    elsewhere = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(HOROVOD_API_DIR)]
    return PathFinder.find_spec("horovod", elsewhere) is not None and importlib.util.find_spec("tf_keras") is not None


@pytest.mark.e2e
@pytest.mark.skipif(not horovod_and_keras_2_installed(), reason="needs Horovod (make setup) and tf-keras (make .venv/.bench-done)")
def test_the_runner_runs_plain_horovod_in_keras_2_under_caramel_run(tmp_path):
    script = tmp_path / "probe" / "probe.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(PROBE))
    manifest = job_manifest(
        name="plain-horovod-probe", script=None, command=[sys.executable, "-m", "benchmarks.plain_horovod_runner", str(script)],
        args=["--flag", "value"], workingDir=str(tmp_path), runPolicy={"backoffLimit": 0},
        env=[{"name": "PYTHONPATH", "value": str(REPO)}],
    )  # fmt: skip
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr[-6000:]
    probes = {}
    for line in result.stderr.splitlines():
        if "| PROBE " in line:
            probe = json.loads(line.split("| PROBE ", 1)[1])
            probes[probe["rank"]] = probe
    assert sorted(probes) == [0, 1], result.stderr[-4000:]
    shim = Path(HOROVOD_API_DIR).resolve()
    for probe in probes.values():
        assert probe["size"] == 2
        assert {"horovod", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod._keras"} <= set(probe["modules"])
        for name, file in probe["modules"].items():  # every horovod module the real Horovod's
            assert file is None or shim not in Path(file).resolve().parents, (name, file)
        assert probe["keras"].startswith("2.") and probe["keras_is_tf_keras"] and probe["K_constant"] and probe["same_dense"]
        assert probe["tf_keras_model"].startswith("tf_keras.")
        assert probe["legacy_env"] == "1"
        assert probe["argv"] == ["--flag", "value"] and probe["path0"] == str(script.parent)
    # Synchronous data-parallel training: the ranks' different data, the same weights in the end.
    assert probes[0]["weights"] == probes[1]["weights"]
    assert math.isclose(probes[0]["loss_averaged"], probes[1]["loss_averaged"], rel_tol=1e-6)
    assert "caramel: 2 ranks on the" not in result.stderr and "caramel: weights digest" not in result.stderr
