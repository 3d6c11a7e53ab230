"""The collective backends' seam (`caramel.collectives.backend`): which backend a job gets, and
what every backend derives from its all-reduce. Collectives between real ranks are checked
end to end (tests/tensorflow/test_correctness.py, tests/horovod/test_horovod_api.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from caramel.collectives import backend as backends
from caramel.collectives.backend import ReduceOp, chosen
from caramel.collectives.tensorflow_backend import BUCKET_BYTES, COPY_KEY_STRIDE, MAX_COPIES, TensorFlowBackend, release_buckets
from caramel.contract.api import Backend as BackendChoice
from caramel.contract.api import CaramelJob
from caramel.contract.env import WorkerContract, slot_env, worker_env


def contract(backend: str) -> WorkerContract:
    job = CaramelJob.model_validate(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "seam"},
         "spec": {"script": "train.py", "workers": {"replicas": 2}, "caramel": {"backend": backend}}}
    )  # fmt: skip
    env = worker_env(job, 0, ["a", "b"])
    return WorkerContract.from_env({**env, **slot_env(env, 0)})


@pytest.mark.parametrize(
    ("wanted", "installed", "expected"),
    [
        ("auto", True, BackendChoice.HOROVOD),  # whatever API the script uses
        ("auto", False, BackendChoice.TENSORFLOW),  # ... where Horovod is not installed
        ("tensorflow", True, BackendChoice.TENSORFLOW),
        ("horovod", True, BackendChoice.HOROVOD),
    ],
)
def test_auto_takes_horovods_collectives_wherever_horovod_is_installed(monkeypatch, wanted, installed, expected):
    monkeypatch.setattr(backends, "horovod_installed", lambda: installed)
    assert chosen(contract(wanted)) is expected


def test_horovod_asked_for_where_it_is_not_installed_fails_naming_the_field(monkeypatch):
    monkeypatch.setattr(backends, "horovod_installed", lambda: False)
    with pytest.raises(RuntimeError, match="spec.caramel.backend is horovod, but Horovod is not installed here"):
        chosen(contract("horovod"))


def test_every_backend_choice_but_auto_names_a_module():
    assert set(backends.BACKENDS) == set(BackendChoice) - {BackendChoice.AUTO}


class Summing(TensorFlowBackend):
    """A backend of rank 1 of 3 whose all-reduce adds what the other two ranks hold: zeros, as
    ranks that are not the root hold in a broadcast, or their own rows of a gather."""

    def __init__(self) -> None:
        super().__init__(rank=1, size=3, local_rank=1, local_size=1, timeout_seconds=1.0)
        self.others: list[tf.Tensor] = []

    def all_reduce(self, tensors, op, name):
        assert op is ReduceOp.SUM
        return [tensor + other for tensor, other in zip(tensors, self.others)]


def test_a_broadcast_is_a_sum_only_the_root_adds_to_in_a_dtype_that_sums_exactly():
    backend = Summing()
    backend.others = [tf.constant([7, 255], tf.int32), tf.constant([1.5])]  # the root's values
    values = backend.broadcast([tf.constant([3, 4], tf.uint8), tf.constant([9.0])], root_rank=0)
    assert values[0].dtype == tf.uint8 and values[0].numpy().tolist() == [7, 255]
    assert values[1].numpy().tolist() == [1.5]


def test_a_gather_places_each_ranks_tensor_in_its_row():
    backend = Summing()
    backend.others = [tf.constant([[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]])]  # ranks 0 and 2's rows
    gathered = backend.all_gather(tf.constant([3.0, 4.0]))
    np.testing.assert_array_equal(gathered.numpy(), [[1, 2], [3, 4], [5, 6]])


def test_tensorflow_collectives_never_reuse_an_instance_key(monkeypatch):
    backend = TensorFlowBackend(rank=0, size=2, local_rank=0, local_size=1, timeout_seconds=1.0)
    keys = []

    def record(**kwargs):
        keys.append(int(kwargs["instance_key"]))
        return kwargs["input"]

    monkeypatch.setattr(tf.raw_ops, "CollectiveReduceV2", record)
    backend.all_reduce([tf.ones([2]), tf.ones([3], tf.float16)], ReduceOp.AVERAGE, "first")  # one per dtype
    backend.all_reduce([tf.ones([2])], ReduceOp.SUM, "second")
    assert keys == [1, 2, 3]
    # Copy i of a step in Caramel's graph of several steps offsets its keys by i strides.
    assert int(backend.copy_variable(3).numpy()) == 3 * COPY_KEY_STRIDE
    with pytest.raises(ValueError, match=f"at most {MAX_COPIES} copies of a step"):
        backend.copy_variable(MAX_COPIES)


def test_the_own_way_of_tensorflows_collectives_sends_buckets_in_the_order_backpropagation_releases():
    # Sizes in bytes of gradients in the sources' order: the last is released first.
    assert release_buckets([1, 2, 3, 4, 5], bucket_bytes=5) == [[4], [3, 2], [1, 0]]
    assert release_buckets([10, 1], bucket_bytes=4) == [[1, 0]]
    assert release_buckets([], bucket_bytes=4) == []


def test_horovods_fusion_buffer_is_read_from_its_variable_as_horovod_reads_it():
    pytest.importorskip("horovod.tensorflow.mpi_ops", reason="Horovod is not installed here")
    from caramel.collectives.horovod_backend import DEFAULT_FUSION_THRESHOLD, fusion_threshold_bytes

    assert fusion_threshold_bytes(None) == DEFAULT_FUSION_THRESHOLD
    assert fusion_threshold_bytes("67108864") == 64 * 1024 * 1024
    # strtol's reading: the leading integer, none at all is 0 (fusion off), never an error.
    assert fusion_threshold_bytes("64MB") == 64
    assert fusion_threshold_bytes(" 0") == 0
    assert fusion_threshold_bytes("off") == 0


def test_tensorflow_collectives_in_a_graph_wait_for_their_inputs_and_the_collectives_traced_before_only():
    backend = TensorFlowBackend(rank=0, size=2, local_rank=0, local_size=1, timeout_seconds=1.0)
    sizes = [BUCKET_BYTES // 4, BUCKET_BYTES // 4, BUCKET_BYTES // 4]  # float32 elements: a bucket each

    @tf.function
    def step(x: tf.Tensor) -> list[tf.Tensor]:
        # A stateful op without a resource input, traced first: without the ordering token,
        # automatic control dependencies would make every collective wait for it.
        noted = tf.numpy_function(lambda value: value, [x], tf.float32, stateful=True)
        gradients = [tf.fill([size], x[0] * (i + 1)) for i, size in enumerate(sizes)]
        return [noted, *backend.own_way(gradients)]

    graph = step.get_concrete_function(tf.TensorSpec([1], tf.float32)).graph
    collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert len(collectives) == 3  # a bucket each, the last gradient's first
    flattened = [op.inputs[0].op for op in collectives]  # each gradient flattened into its bucket's buffer
    assert [op.inputs[0].op.name for op in flattened] == ["Fill_2", "Fill_1", "Fill"]
    assert [[c.name for c in op.control_inputs] for op in collectives] == [[], [collectives[0].name], [collectives[1].name]]


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (tf.errors.UnavailableError(None, None, "recvmsg:Connection reset by peer"), True),  # the peer's server gone
        (tf.errors.AbortedError(None, None, "Collective ops is aborted by: ..."), True),
        (tf.errors.DeadlineExceededError(None, None, "Collective has timed out during execution."), True),
        (tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"), False),  # the script's own error
        (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"), False),
    ],
)
def test_the_tensorflow_backend_tells_a_lost_peer_from_the_scripts_own_errors(error, lost):
    """An elastic gang re-forms on the first, and fails as any job on the others."""
    assert TensorFlowBackend(rank=0, size=2, local_rank=0, local_size=1, timeout_seconds=1.0).lost_peer(error) is lost
