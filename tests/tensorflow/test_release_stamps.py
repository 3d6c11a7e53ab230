"""The own graph's stamps of its gradients' releases, as the replanner reads them into its compute
model: a real step's graph on a backend of one rank."""

from __future__ import annotations

import time

import pytest
import tensorflow as tf

from caramel.contract.api import CaramelJob
from caramel.contract.env import WorkerContract, slot_env, worker_env
from caramel.planner.schedule import TensorCost, release_times
from caramel.tensorflow.communicator import GradientCommunicator
from caramel.tensorflow.replanner import measured_costs

LAST_LAYERS_BACKWARD_SECONDS = 0.3


@pytest.fixture
def communicator(one_rank) -> GradientCommunicator:
    job = CaramelJob.model_validate(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "stamps"},
         "spec": {"script": "train.py", "workers": {"replicas": 1}}}
    )  # fmt: skip
    env = worker_env(job, 0, ["a"])
    return GradientCommunicator(WorkerContract.from_env({**env, **slot_env(env, 0)}), one_rank)


def test_the_last_layers_backward_pass_before_the_first_gradient_reaches_the_plans(communicator):
    # The last layer's backward pass takes 0.3 s before any gradient exists (a transformer's
    # projection onto its vocabulary); no gap between the releases shows it.
    first, last = tf.Variable(tf.ones([4])), tf.Variable(tf.ones([4]))

    @tf.custom_gradient
    def slow_backward(x: tf.Tensor) -> tuple[tf.Tensor, object]:
        def backward(upstream: tf.Tensor) -> tf.Tensor:
            waited = tf.numpy_function(lambda value: (time.sleep(LAST_LAYERS_BACKWARD_SECONDS), value)[1], [upstream], tf.float32)
            return tf.ensure_shape(waited, upstream.shape)

        return tf.identity(x), backward

    @tf.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = slow_backward(tf.reduce_sum(last * tf.reduce_sum(first)))
        gradients = tape.gradient(loss, [first, last])
        with communicator.tracing_own_graph():
            return communicator.allreduce(gradients)

    step()
    communicator.measure_own_step()
    (observed,) = communicator.control.replanner._recent  # noqa: SLF001 (what the next search plans with)
    costs = measured_costs([TensorCost(16, 4)] * 2, observed.backward_seconds)
    # The plans see the first gradient come no earlier than that backward pass ends (were the span
    # from the step's start not counted, about 0 s). The start's stamp has no input, so nothing orders it before
    # the sleep: on a loaded machine it once ran a little after the sleep began (make test-fast).
    assert release_times(costs)[-1] >= 0.8 * LAST_LAYERS_BACKWARD_SECONDS
