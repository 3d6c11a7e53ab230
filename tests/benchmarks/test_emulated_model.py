"""The emulated model's gradients, as each `--gradients` kind makes them: computed in the backward
pass (a new tensor of the weight's shape), the weights' own values, or computed with no static
shape, which the runtime must send apart from the others (communicator.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from benchmarks import emulated_model
from benchmarks.profiles import Profile, TensorProfile
from benchmarks.workloads import GRADIENTS

PROFILE = Profile("tiny", 1, 1.0, (TensorProfile("kernel", (3, 2), 1e-4, 1e-4), TensorProfile("bias", (2,), 1e-4, 1e-4)))


@pytest.mark.parametrize("kind", GRADIENTS)
def test_each_kind_of_gradient_is_its_weights_value_with_its_static_shape_or_none(kind: str) -> None:
    model = emulated_model.build_model(PROFILE, gradients=kind)
    shapes = []

    @tf.function
    def gradients(features: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = emulated_model.loss(None, model(features))
        result = tape.gradient(loss, model.trainable_variables)
        shapes.extend(gradient.shape for gradient in result)
        return result

    values = gradients(tf.ones([1, 1]))
    for value, variable in zip(values, model.trainable_variables):
        assert value.numpy() == pytest.approx(variable.numpy())  # the weight, scaled by 1
    assert [shape.is_fully_defined() for shape in shapes] == [kind != "unshaped"] * 2
