"""Only one TensorFlow: tf-keras's requirement on the full `tensorflow` must not add a second one
beside tensorflow-cpu (make setup and the Dockerfile install it without dependencies)."""

from __future__ import annotations

import tomllib

from caramel.job.one_tensorflow import installed_tensorflows
from conftest import REPO


def test_exactly_one_tensorflow_distribution_is_installed():
    assert installed_tensorflows() == ["tensorflow-cpu"]


def test_tf_keras_is_installed_without_dependencies_everywhere():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert not any(dep.startswith("tf-keras") for dep in pyproject["project"]["dependencies"])
    assert pyproject["tool"]["caramel"]["install-without-dependencies"] == ["tf-keras==2.18.0"]
    assert "--no-deps $(NO_DEPS)" in (REPO / "Makefile").read_text()
    assert "pip install --no-cache-dir --no-deps -r /opt/caramel/no-deps.txt" in (REPO / "Dockerfile").read_text()
