"""TensorFlow's own collective ops (`CollectiveReduceV2`) over gRPC: nothing to compile.

Every training process runs a TensorFlow server on its collective port (the job's env contract),
in a cluster of one task per rank, with TensorFlow's coordination service led by rank 0: the
same executor MultiWorkerMirroredStrategy sets up, without the strategy. A collective is known
to the ranks by its instance key, which TensorFlow binds to the collective's shape for the
process's lifetime; so keys are never reused: each collective traced or run eagerly takes the
next one, and every rank traces and runs the same collectives in the same order. A step copied
into Caramel's graph of several steps reads a per-copy offset (`copy_variable`), so that each
copy's collectives have keys of their own.

Every collective in a graph takes one ordering token, a resource (as MultiWorkerMirroredStrategy's
do): `CollectiveReduceV2` is a stateful op, and tf.function's automatic control dependencies chain
every stateful op without a resource input in program order, so without a token each collective
would wait for every such op traced before it (a `tf.print`, a `py_function` of the user's
backward pass) as well as for its own inputs. With the token the collectives are ordered among
themselves, in the order they were traced, and against nothing else.

On a process with a GPU, a collective goes where its tensor is: a tensor on the GPU (or one a
graph has not placed yet, which the placer puts there) over NCCL, one on the CPU over TensorFlow's
ring (`route`); each kind of device has a group of its own, since TensorFlow binds a group key to
one device type, and an ordering token made on that device, as MultiWorkerMirroredStrategy keeps
one per device (a resource input pulls its op to the resource's device). A process without a GPU
runs its collectives as it always did: one group, the ring, and no device named.

A collective waits for its peers at most the contract's collective timeout, and a peer whose
process ended fails it at once (its server is gone): the step then fails, and the process exits
and the gang restarts as after any failure; or, in an elastic gang (Horovod's `hvd.elastic`), the
survivors restart their processes to re-form, keeping their last commit: TensorFlow's collective
executor and coordination service, once started, serve one cluster for the process's lifetime.
The coordination service waits as long as a collective for a slow peer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.core.protobuf import cluster_pb2, config_pb2, error_codes_pb2, tensorflow_server_pb2
from tensorflow.python.eager import context

from caramel.collectives.backend import Backend, ReduceOp
from caramel.collectives.fusion import joined
from caramel.contract.env import WorkerContract

JOB = "worker"
COPY_KEY_STRIDE = 1 << 24
"""Instance keys of copy i of a step are its trace's keys plus i times this: a process may take
this many keys (traces and eager calls) before copies' keys could meet."""
MAX_COPIES = (1 << 31) // COPY_KEY_STRIDE
MERGE = {ReduceOp.SUM: ("Add", "Id"), ReduceOp.AVERAGE: ("Add", "Div"), ReduceOp.MIN: ("Min", "Id"), ReduceOp.MAX: ("Max", "Id")}
BUCKET_BYTES = 4 * 1024 * 1024
"""The backend's own way sends the gradients in buckets of about this size: TensorFlow has no
background thread to fuse what is ready, as Horovod's does, and a collective per gradient would pay
a collective's fixed cost (several gRPC round trips) per tensor; one bucket of everything (as
MultiWorkerMirroredStrategy packs them) would start only once the backward pass is over."""


@dataclass(frozen=True)
class Route:
    """How a collective of tensors on one kind of device runs among all ranks."""

    device_type: str
    group_key: int
    """TensorFlow binds a group key to one device type: each kind of device is a group of its own."""
    communication_hint: str
    """The implementation: NCCL between GPUs, TensorFlow's ring (over gRPC) between CPUs."""


ROUTES = {"CPU": Route("CPU", 1, "ring"), "GPU": Route("GPU", 2, "nccl")}


def route(device: str, gpu_visible: bool) -> Route:
    """The route of a collective of a tensor placed on `device`: that device's kind; where the
    tensor names none (a graph's, before placement), the GPU on a process that has one, whose
    placer puts the ops there, else the CPU."""
    named = tf.DeviceSpec.from_string(device).device_type if device else None
    return ROUTES[named or ("GPU" if gpu_visible else "CPU")]


class TensorFlowBackend(Backend):
    name = "tensorflow"
    own_way_name = "TensorFlow's collectives in buckets as the gradients come"
    gpu_transport = "NCCL (TensorFlow's collectives, communication_hint nccl)"

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int, timeout_seconds: float, gpu_visible: bool = False) -> None:
        super().__init__(rank, size, local_rank, local_size)
        self.timeout_seconds = timeout_seconds
        self.gpu_visible = gpu_visible
        """Whether the process trains on a GPU: its collectives then name their device (`route`)."""
        self._next_key = 1
        self._lock = threading.Lock()
        self._copies: dict[int, tf.Variable] = {}
        self._ordering_tokens: dict[Route, tf.Variable] = {}

    def lost_peer(self, error: tf.errors.OpError) -> bool:
        """A peer's server gone fails a collective as unreachable (a connection reset or refused),
        and every collective of the process after it as aborted; a peer silent for the collective
        timeout fails it as past its deadline."""
        return isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError))

    def leave(self) -> None:
        """Abort this process's collective executor (as MultiWorkerMirroredStrategy does when a
        peer fails its health check): the collectives under way and to come fail as unreachable,
        and so do peers' that wait on this rank's data."""
        context.context().abort_collective_ops(error_codes_pb2.UNAVAILABLE, "caramel: the ranks broke (a peer was lost, or one left to re-form)")

    def ordering_token(self, path: Route) -> tf.Variable:
        """The resource every collective of `path` in a graph takes as its ordering token (see the
        module's docstring); made at set-up, in the job's cluster, not while a step is traced."""
        if path not in self._ordering_tokens:
            with tf.init_scope(), self._placed(path):
                self._ordering_tokens[path] = tf.Variable(0.0, trainable=False, name="caramel_collective_order")
        return self._ordering_tokens[path]

    def _placed(self, path: Route) -> contextlib.AbstractContextManager[object]:
        """Where a collective of `path`, or its ordering token, goes: its device on a process with a
        GPU; unnamed, as always, on one without."""
        return tf.device(f"/device:{path.device_type}:0") if self.gpu_visible else contextlib.nullcontext()

    def copy_variable(self, copy: int) -> tf.Variable:
        """The variable copy `copy` of a step reads to offset its collectives' keys (the trace reads
        copy 0's, which is 0; Caramel's graph of several steps maps it to each copy's)."""
        if not 0 <= copy < MAX_COPIES:
            raise ValueError(f"a graph holds at most {MAX_COPIES} copies of a step on the tensorflow backend, not {copy + 1}")
        if copy not in self._copies:
            with tf.init_scope(), self._placed(ROUTES["CPU"]):
                self._copies[copy] = tf.Variable(copy * COPY_KEY_STRIDE, dtype=tf.int32, trainable=False, name=f"caramel_copy_keys_{copy}")
        return self._copies[copy]

    def all_reduce(self, tensors: Sequence[tf.Tensor], op: ReduceOp, name: str) -> list[tf.Tensor]:
        """The tensors (of one device, as a step's gradients are) joined and reduced where they
        are: on a GPU, the joining too, so that nothing goes through the host on the way."""
        tensors = [tf.convert_to_tensor(tensor) for tensor in tensors]
        path = route(tensors[0].device if tensors else "", self.gpu_visible)
        with self._placed(path):
            return joined(tensors, name, lambda flat, _: self._collective(flat, op, path))

    @property
    def own_way_fusion_bytes(self) -> int:
        return BUCKET_BYTES

    def own_way(self, gradients: Sequence[tf.Tensor], op: ReduceOp = ReduceOp.AVERAGE) -> list[tf.Tensor]:
        """As Horovod's tape sends them, with TensorFlow's collectives: in the order
        backpropagation releases them (the sources' order reversed), in buckets of about
        BUCKET_BYTES, each one collective per dtype that starts once its own gradients exist,
        and waits for nothing else but the collectives traced before it."""
        averaged: list[tf.Tensor | None] = [None] * len(gradients)
        for number, bucket in enumerate(release_buckets([g.shape.num_elements() * g.dtype.size for g in gradients], BUCKET_BYTES)):
            for index, value in zip(bucket, self.all_reduce([gradients[i] for i in bucket], op, f"caramel_gradients_{number}")):
                averaged[index] = value
        return averaged

    def _collective(self, tensor: tf.Tensor, op: ReduceOp, path: Route) -> tf.Tensor:
        merge, final = MERGE[op]
        if self.size == 1:
            return tf.identity(tensor)
        with self._lock:
            key = self._next_key
            self._next_key += 1
        if key >= COPY_KEY_STRIDE:
            raise RuntimeError(f"this process ran out of collective instance keys ({COPY_KEY_STRIDE} traced or eager collectives)")
        ordering_token = []
        with self._placed(ROUTES["CPU"]):  # the key is a host scalar, as the collective takes it
            instance_key = tf.constant(key, tf.int32)
            if not tf.executing_eagerly():
                instance_key += self.copy_variable(0).read_value()
                ordering_token = [self.ordering_token(path).handle]
        with self._placed(path):
            return tf.raw_ops.CollectiveReduceV2(
                input=tensor, group_size=self.size, group_key=path.group_key, instance_key=instance_key, ordering_token=ordering_token,
                merge_op=merge, final_op=final, communication_hint=path.communication_hint, timeout_seconds=self.timeout_seconds,
            )  # fmt: skip


def set_up(contract: WorkerContract) -> TensorFlowBackend:
    """Start this rank's server in the job's cluster and set up the collective executor."""
    rank, size = contract.required_rank, contract.world_size
    # After the runtime narrowed TensorFlow to the rank's GPU (caramel.tensorflow.devices).
    gpu_visible = bool(tf.config.get_visible_devices("GPU"))
    backend = TensorFlowBackend(rank, size, contract.local_rank, contract.slots_per_worker, contract.collective_timeout_seconds, gpu_visible)
    if size > 1:
        _start_server(contract, rank, size)
    # Made now, not while a step is traced (a variable made while tf.function traces makes it
    # trace the whole function a second time), and after the server: a variable lives on a device
    # of the cluster it was made in.
    backend.copy_variable(0)
    for path in {route("", gpu_visible), ROUTES["CPU"]}:
        backend.ordering_token(path)
    return backend


def release_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of tensors of these sizes (bytes, in the sources' order), in the order
    backpropagation releases them (the last first), cut into consecutive buckets that each reach
    `bucket_bytes`, but for the last."""
    buckets: list[list[int]] = [[]]
    filled = 0
    for index in reversed(range(len(sizes))):
        if filled >= bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += sizes[index]
    return [bucket for bucket in buckets if bucket]


def _start_server(contract: WorkerContract, rank: int, size: int) -> None:
    """This rank's TensorFlow server, in a cluster of every rank, with the collective executor."""
    cluster = cluster_pb2.ClusterDef()
    job = cluster.job.add()
    job.name = JOB
    addresses = contract.collective_addresses
    for task, (host, port) in enumerate(addresses):
        job.tasks[task] = f"{host}:{port}"
    leader = f"/job:{JOB}/replica:0/task:0"
    config = config_pb2.ConfigProto()
    config.experimental.collective_group_leader = leader
    config.device_filters.append(f"/job:{JOB}/task:{rank}")
    # The coordination service (led by rank 0), as MultiWorkerMirroredStrategy starts it: it lines
    # the tasks up at start and tells every task when one of them is gone.
    coordination = config.experimental.coordination_config
    coordination.service_type = "standalone"
    coordination.service_leader = leader
    coordination.coordinated_job_list.append(coordination_config_pb2.CoordinatedJob(name=JOB, num_tasks=size))
    # Its waits for a task, as long as the contract lets any peer take: TensorFlow's defaults
    # declare a task dead after 10 s without a heartbeat, and a rank that gets no CPU for that long
    # (ranks starting on fewer cores than they are, or beside busier processes) failed the whole
    # gang ("The following tasks are unhealthy (stopped sending heartbeats)"), which a collective
    # would have waited for. A task whose process ended is still seen at once: its connections close.
    patience_ms = int(contract.collective_timeout_seconds * 1000)
    coordination.heartbeat_timeout_in_ms = patience_ms
    coordination.cluster_register_timeout_in_ms = patience_ms
    coordination.shutdown_barrier_timeout_in_ms = patience_ms
    server = tensorflow_server_pb2.ServerDef(
        cluster=cluster, job_name=JOB, task_index=rank, protocol="grpc", port=addresses[rank][1], default_session_config=config
    )
    ctx = context.context()
    # Everything is in the ServerDef, so this works after the script ran TensorFlow ops too:
    # tensors made before stay usable, variables made before do not (init first, as Horovod's
    # hvd.init()). TensorFlow warns of both alike; docs/training-scripts.md says which.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        ctx.enable_collective_ops(server)
    finally:
        absl_logger.setLevel(level)
    ctx.ensure_initialized()
