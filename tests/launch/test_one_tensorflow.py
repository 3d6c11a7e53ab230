"""Only one TensorFlow, and Keras 3: a second TensorFlow distribution beside tensorflow-cpu (as
tf-keras's requirement on the full `tensorflow` would bring) overwrites its files."""

from __future__ import annotations

import tomllib

from caramel.launch.one_tensorflow import installed_tensorflows
from conftest import REPO


def test_exactly_one_tensorflow_distribution_is_installed():
    assert installed_tensorflows() == ["tensorflow-cpu"]


def test_keras_3_is_the_products_keras():
    import keras

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(dep.startswith("keras==3.") for dep in dependencies)
    assert not any(dep.startswith("tf-keras") for dep in dependencies)  # installed without its dependencies: versions.md
    assert keras.__version__.startswith("3.")
    assert "TF_USE_LEGACY_KERAS" not in (REPO / "Dockerfile").read_text()  # the image's default is Keras 3; a job may ask for 2
