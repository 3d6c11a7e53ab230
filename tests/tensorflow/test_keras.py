"""Keras `model.fit` as a Caramel job (examples/train_keras.py): progress, metrics' step count,
and resume from a checkpoint at an epoch boundary with the weights of an uninterrupted run, or at
the last epoch with the final step reported."""

from __future__ import annotations

import re

import numpy as np
import pytest

from caramel.contract.progress import parse_report
from conftest import REPO, job_manifest, run_caramel, write_manifest
from testbed.local_runs import checkpoint_weights

pytestmark = pytest.mark.e2e

KERAS_EXAMPLE = REPO / "examples" / "train_keras.py"
HIDDEN = 64


def keras_job(tmp_path, directory: str, epochs: int, steps_per_execution: int = 3):
    manifest = job_manifest(
        script=str(KERAS_EXAMPLE),
        args=[
            "--epochs", str(epochs), "--steps-per-epoch", "6", "--steps-per-execution", str(steps_per_execution), "--batch-size", "32",
            "--hidden", str(HIDDEN),
        ],
        checkpoint={"path": str(tmp_path / directory), "intervalSteps": 6},
    )  # fmt: skip
    return write_manifest(tmp_path, manifest, filename=f"{directory}-{epochs}.yaml")


@pytest.mark.recovery
def test_fit_resumes_at_the_checkpointed_epoch_with_the_weights_of_an_uninterrupted_run(tmp_path):
    straight = run_caramel("run", str(keras_job(tmp_path, "straight", 4)))
    assert straight.returncode == 0, straight.stderr
    assert "step=24 total=24" in straight.stderr and "Succeeded" in straight.stderr

    first = run_caramel("run", str(keras_job(tmp_path, "resumed", 2)))
    assert first.returncode == 0, first.stderr
    second = run_caramel("run", str(keras_job(tmp_path, "resumed", 4)))
    assert second.returncode == 0, second.stderr
    assert re.search(r"restored .*ckpt-12 at step 12", second.stderr), second.stderr

    expected, resumed = checkpoint_weights(tmp_path / "straight"), checkpoint_weights(tmp_path / "resumed")
    assert expected.keys() == resumed.keys() and len(expected) == 6
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)

    # Restored at the last epoch, fit has nothing to run, and the run still reports its step.
    again = run_caramel("run", str(keras_job(tmp_path, "resumed", 4)))
    assert again.returncode == 0, again.stderr
    reports = [report for report in map(parse_report, again.stderr.splitlines()) if report]
    assert [(r.step, r.total, r.final) for r in reports] == [(24, 24, True)], again.stderr


def test_a_fit_compiled_at_one_step_runs_several_per_graph_with_the_weights_of_one_step_per_graph(tmp_path):
    """No callback of the example's fit but Caramel's acts on single batches: compiled at one step
    per execution, it runs as many per graph as divide its epoch of 6 (3), and ends with the
    weights of the same fit compiled at 3 (the same steps, in graphs of Caramel's)."""
    compiled = run_caramel("run", str(keras_job(tmp_path, "compiled", 2)))
    assert compiled.returncode == 0, compiled.stderr
    one = run_caramel("run", str(keras_job(tmp_path, "one", 2, steps_per_execution=1)))
    assert one.returncode == 0, one.stderr
    assert one.stderr.count("caramel: 3 steps per graph (compile gave steps_per_execution 1") == 1, one.stderr
    assert "step=12 total=12" in one.stderr
    expected, got = checkpoint_weights(tmp_path / "compiled"), checkpoint_weights(tmp_path / "one")
    assert expected.keys() == got.keys() and expected
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)
