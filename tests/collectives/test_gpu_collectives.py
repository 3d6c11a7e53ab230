"""The collective each tensor's device selects (item: GPU collectives on both backends).

TensorFlow's collectives: NCCL for a tensor on a GPU, the ring for one on the CPU, each kind of
device a group of its own with its own ordering token, and a process without a GPU exactly as
before. No GPU runs here: the graphs are traced with real TensorFlow and read, not run."""

from __future__ import annotations

import pytest
import tensorflow as tf

from caramel.collectives.backend import ReduceOp
from caramel.collectives.tensorflow_backend import ROUTES, TensorFlowBackend, route


@pytest.mark.parametrize(
    ("device", "gpu_visible", "expected"),
    [
        ("", False, ("CPU", 1, "ring")),  # a CPU job: as it always ran
        ("/job:worker/replica:0/task:1/device:CPU:0", False, ("CPU", 1, "ring")),
        ("", True, ("GPU", 2, "nccl")),  # a graph's gradient, placed on the rank's GPU
        ("/job:worker/replica:0/task:1/device:GPU:0", True, ("GPU", 2, "nccl")),
        ("/device:CPU:0", True, ("CPU", 1, "ring")),  # a host tensor of a GPU job stays on the host
    ],
)
def test_the_route_of_a_collective_follows_its_tensors_device(device, gpu_visible, expected):
    chosen = route(device, gpu_visible)
    assert (chosen.device_type, chosen.group_key, chosen.communication_hint) == expected


def traced_collective(backend: TensorFlowBackend, device: str | None) -> tf.Operation:
    @tf.function(autograph=False)
    def step(x):
        if device:
            with tf.device(device):
                x = tf.identity(x)
        return backend.all_reduce([x], ReduceOp.AVERAGE, "gradient")

    graph = step.get_concrete_function(tf.TensorSpec([4], tf.float32)).graph
    (collective,) = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    return collective


def group_key(collective: tf.Operation) -> int:
    return int(tf.get_static_value(collective.inputs[2]))


@pytest.mark.parametrize(
    ("gpu_visible", "device", "placed", "key", "hint"),
    [
        (False, None, "", 1, b"ring"),
        (True, None, "/device:GPU:0", 2, b"nccl"),
        (True, "/device:CPU:0", "/device:CPU:0", 1, b"ring"),
    ],
)
def test_a_traced_collective_is_placed_keyed_and_ordered_by_its_route(gpu_visible, device, placed, key, hint):
    backend = TensorFlowBackend(0, 2, 0, 1, timeout_seconds=5.0, gpu_visible=gpu_visible)
    collective = traced_collective(backend, device)
    assert (collective.device, group_key(collective), collective.get_attr("communication_hint")) == (placed, key, hint)
    # Its ordering token is its route's (a resource input pulls an op to the resource's device,
    # where the token was made: a GPU here has none, so only which token is checked).
    captured = {id(inside): outside for outside, inside in collective.graph.captures}
    token = captured[id(collective.inputs[-1])]
    assert token is backend.ordering_token(ROUTES["GPU" if key == 2 else "CPU"]).handle
    assert backend.ordering_token(ROUTES["GPU"]) is not backend.ordering_token(ROUTES["CPU"])


def test_horovod_says_whether_nccl_carries_gpu_tensors():
    """hvd.nccl_built() is NCCL's version code (2.27.7: 22707) in the GPU image, 0 here."""
    pytest.importorskip("horovod.tensorflow.mpi_ops", reason="Horovod is not installed here")
    from caramel.collectives.horovod_backend import gpu_transport

    assert gpu_transport(22707) == "NCCL 2.27.7 (Horovod built with it)"
    assert gpu_transport(0) == "Gloo, through host memory: this Horovod was built without NCCL"
