"""Every public path and scheduling mode gives the results of plain synchronous SGD, with real
ranks on each collective backend: the tape and the optimizer with several steps per graph, a
tf.function per step, eager steps, and Keras `fit`; on Keras 3, and on Keras 2 (tf-keras) where
a job asks for it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from caramel.planner.rounds import settled_step
from conftest import KERAS_2, REPO, job_manifest, run_caramel, write_manifest
from testbed.lab import lab_variables
from testbed.sgd_reference import synchronous_sgd

pytestmark = pytest.mark.e2e

MODES = {
    # Each mode: spec.caramel, and the benchmarks' ablations (lab settings, testbed/lab.py) in the job's environment.
    "automatic": ({}, {}),
    "horovod-order-unbatched": ({}, {"ordering": "arrival", "batching": "off"}),
    "small-chunks": ({"minBucketBytes": 1024, "maxBucketBytes": 4096}, {"batching": "fixed"}),
    "replanning": ({"minBucketBytes": 4096, "maxBucketBytes": 262144, "replanIntervalSteps": 3}, {}),
    # Re-planning often: the replanner's probes go through the trees between graph executions.
    "multitree": ({"allreduce": "multitree", "minBucketBytes": 4096, "maxBucketBytes": 65536, "replanIntervalSteps": 3}, {}),
    "split-collectives": ({"minBucketBytes": 4096, "maxBucketBytes": 65536}, {"collective": "split"}),
}
APIS = ("tape-fit", "optimizer-fit", "tape-loop", "eager", "keras")
BACKENDS = ("tensorflow", "horovod")
RANKS, STEPS, BATCH, HIDDEN = 2, 15, 16, 32
WEIGHTS = "weights.npz"


@pytest.fixture(scope="module")
def expected() -> list[np.ndarray]:
    return synchronous_sgd(STEPS, RANKS, BATCH, HIDDEN)


@pytest.fixture(scope="module")
def expected_on_keras_2(tmp_path_factory) -> list[np.ndarray]:
    """Synchronous SGD on Keras 2, in a process of its own (this one's tf.keras is Keras 3)."""
    output = tmp_path_factory.mktemp("keras2") / "weights.npz"
    command = [sys.executable, "-m", "testbed.sgd_reference", "--steps", str(STEPS), "--ranks", str(RANKS), "--batch-size", str(BATCH),
               "--hidden", str(HIDDEN), "--output", str(output)]  # fmt: skip
    result = subprocess.run(command, env={**os.environ, **KERAS_2}, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = np.load(output)
    return [saved[f"arr_{index}"] for index in range(len(saved.files))]


def trained_weights(tmp_path, api: str, caramel: dict, steps_per_execution: int = 4) -> list[np.ndarray]:
    """Rank 0's weights after training through `api` with these spec.caramel settings."""
    return train(tmp_path, api, caramel, steps_per_execution)[0]


def train(
    tmp_path,
    api: str,
    caramel: dict,
    steps_per_execution: int,
    lab: dict | None = None,
    env: dict | None = None,
    steps: int = STEPS,
) -> tuple[list[np.ndarray], str]:
    """Rank 0's weights after training `steps` steps through `api` with these spec.caramel
    settings, lab settings and extra environment variables, and the job's standard error."""
    result = run_caramel("run", str(write_manifest(tmp_path, sgd_job(tmp_path, api, caramel, steps_per_execution, lab, env, steps))))
    assert result.returncode == 0, result.stderr
    if api != "eager":
        algorithm = "multitree" if caramel.get("allreduce") == "multitree" else "ring"
        assert f"gradients all-reduced by {algorithm}" in result.stderr
    saved = np.load(tmp_path / WEIGHTS)
    return [saved[f"arr_{index}"] for index in range(len(saved.files))], result.stderr


def sgd_job(
    tmp_path, api: str, caramel: dict, steps_per_execution: int, lab: dict | None = None, env: dict | None = None, steps: int = STEPS, **spec
) -> dict:
    """The job of testbed/sgd_worker.py's training (rank 0 saves its weights in `tmp_path`). The
    steps wait for the first plan's search (a lab setting: these steps take milliseconds, the
    search's process about a second to start), so that Caramel's graph of several steps runs
    from the second execution on."""
    env = {**lab_variables(first_plan_waits=True, **(lab or {})), **(env or {})}
    command = [
        sys.executable, "-m", "testbed.sgd_worker", "--api", api, "--steps", str(steps), "--batch-size", str(BATCH),
        "--hidden", str(HIDDEN), "--steps-per-execution", str(steps_per_execution), "--output", str(tmp_path / WEIGHTS),
    ]  # fmt: skip
    extra_env = [{"name": name, "value": value} for name, value in env.items()]
    return job_manifest(script=None, command=command, args=[], caramel=caramel, workers={"replicas": RANKS}, env=extra_env, **spec)


def assert_same_weights(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected) == 6
    for index, (weight, wanted) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(weight, wanted, rtol=1e-5, atol=1e-6, err_msg=f"trainable variable {index}")


# The paths whose runs go on past Caramel's first rounds, into the graph the round chose: each
# path's one run on each backend (test_steps_that_go_between_...); the other paths run here.
SETTLED_APIS = ("tape-fit", "keras")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", [api for api in APIS if api not in SETTLED_APIS])
def test_every_public_path_matches_synchronous_sgd(tmp_path, expected, api, backend):
    assert_same_weights(trained_weights(tmp_path, api, {"backend": backend}), expected)


# Each path on Keras 2 once, on one backend each: which Keras the script runs on and which
# backend moves its gradients are independent (every path runs on both backends above and below).
@pytest.mark.parametrize(("api", "backend"), [("tape-fit", "tensorflow"), ("keras", "horovod")])
def test_caramels_paths_on_keras_2_match_synchronous_sgd_on_keras_2(tmp_path, expected_on_keras_2, api, backend):
    """A job whose environment asks for Keras 2 (TF_USE_LEGACY_KERAS=1) trains on tf-keras: its
    optimizer's updates and Keras 2's own `fit`, several steps per graph."""
    weights, stderr = train(tmp_path, api, {"backend": backend}, steps_per_execution=4, env=KERAS_2)
    assert "tf.keras is Keras 2" in stderr
    assert_same_weights(weights, expected_on_keras_2)


# Each mode on each backend, but two: split collectives on TensorFlow's, which has no reduce-scatter
# on the CPU (test_split_collectives_are_refused_on_tensorflow), and multitree on Horovod's, as
# multitree's transfers go by the trees whatever the backend (the backend's own way, the other
# arm, runs on both backends in every other mode).
NOT_RUN = {("split-collectives", "tensorflow"), ("multitree", "horovod")}
MODE_RUNS = [(mode, backend) for mode in MODES if mode != "automatic" for backend in BACKENDS if (mode, backend) not in NOT_RUN]


@pytest.mark.parametrize(("mode", "backend"), MODE_RUNS)
def test_every_scheduling_mode_matches_synchronous_sgd(tmp_path, expected, mode, backend):
    caramel, lab = MODES[mode]
    # Several steps per graph, with a step count that leaves a shorter last execution.
    weights, _ = train(tmp_path, "tape-fit", {**caramel, "backend": backend}, steps_per_execution=4, lab=lab)
    assert_same_weights(weights, expected)


def test_split_collectives_are_refused_on_tensorflow(tmp_path):
    # No restarts (backoffLimit 0): each would refuse the same job again.
    manifest = sgd_job(tmp_path, "tape-fit", {"backend": "tensorflow"}, 4, {"collective": "split"}, runPolicy={"backoffLimit": 0})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode != 0
    assert "the planning policy's collective split needs reduce-scatter, which the tensorflow backend has not on the CPU" in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", SETTLED_APIS)
def test_steps_that_go_between_caramels_graph_and_the_backends_own_match_synchronous_sgd(tmp_path, api, backend):
    # Past Caramel's first rounds: the round between its graph of several steps and the
    # backend's own graph of one step (graph_choice.py) runs blocks of each, and the steps go on
    # in the one chosen.
    steps = settled_step(4) + 8
    weights, stderr = train(tmp_path, api, {"backend": backend}, steps_per_execution=4, steps=steps)
    assert "steps run Caramel's graph of several steps" in stderr or "in a graph of one step: measured" in stderr, stderr
    assert_same_weights(weights, synchronous_sgd(steps, RANKS, BATCH, HIDDEN))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transfer_of_gradients_of_two_dtypes_averages_each(tmp_path, backend):
    manifest = job_manifest(
        script=None, command=[sys.executable, "-m", "testbed.mixed_dtype_worker"], args=[], workers={"replicas": RANKS},
        caramel={"backend": backend},
    )  # fmt: skip
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    reports = [line.split("| ", 1)[1] for line in result.stderr.splitlines() if "exact_averages" in line]
    assert reports == ['{"exact_averages": ["float32", "float16"]}'] * RANKS, result.stderr
