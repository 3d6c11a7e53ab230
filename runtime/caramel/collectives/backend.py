"""The collective backends' seam: what a backend provides, and which one a job gets.

Caramel decides which gradients travel together, in which order and how many at once; a backend
moves them. Each backend is one module of `caramel.collectives`, listed in `BACKENDS`, whose
`set_up(contract)` joins the job's ranks and returns a `Backend`:
- `horovod` (`horovod_backend`): Horovod's collectives over Gloo (its C++ ops, built at set-up:
  docs/versions.md);
- `tensorflow` (`tensorflow_backend`): TensorFlow's own collective ops over gRPC; nothing is
  compiled.

A backend provides the set-up, one fused all-reduce (in a graph or eagerly), and its own way of
averaging a step's gradients: the baseline that Caramel measures its plans against and falls
back to. Broadcasts, gathers and the replanner's probes are built from the all-reduce here, so
adding a backend means one module and a line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

import tensorflow as tf

from caramel.collectives.horovod_installation import real_horovod_dir
from caramel.contract.api import Backend as BackendChoice
from caramel.contract.env import WorkerContract

BACKENDS = {BackendChoice.HOROVOD: "caramel.collectives.horovod_backend", BackendChoice.TENSORFLOW: "caramel.collectives.tensorflow_backend"}


# Dtypes that collectives may not sum, and the dtype each is summed in, exactly, by `broadcast`.
SUMMED_AS = {
    tf.bool: tf.int32, tf.int8: tf.int32, tf.uint8: tf.int32, tf.int16: tf.int32, tf.uint16: tf.int32, tf.uint32: tf.int64,
    tf.bfloat16: tf.float32,
}  # fmt: skip


class ReduceOp(StrEnum):
    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"


class Backend(ABC):
    """The collectives of one process among the job's ranks."""

    name: ClassVar[str]
    own_way_name: ClassVar[str]
    """The baseline, for people: what `own_way` does."""

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int) -> None:
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size

    @abstractmethod
    def all_reduce(self, tensors: Sequence[tf.Tensor], op: ReduceOp, name: str) -> list[tf.Tensor]:
        """Each tensor reduced elementwise over all ranks, as one collective per dtype: in a graph
        (the collective then starts once every tensor exists) or eagerly (it returns once done).
        `name` tells this collective from the others of the graph, the same on every rank."""

    @property
    @abstractmethod
    def own_way_fusion_bytes(self) -> int:
        """The most bytes `own_way` sends in one collective, for the planner's prediction of it."""

    @abstractmethod
    def own_way(self, gradients: Sequence[tf.Tensor], op: ReduceOp = ReduceOp.AVERAGE) -> list[tf.Tensor]:
        """A step's gradients averaged (or summed) as the backend's own API does it (Horovod's tape,
        or MultiWorkerMirroredStrategy): the baseline Caramel's plans are measured against."""

    gpu_transport: str = "NCCL"
    """What carries a collective of GPU tensors, for people."""

    reforms: ClassVar[bool] = False
    """Whether `reform` re-forms this backend's ranks in the process (elastic training); where it
    does not, an elastic gang's training processes restart to re-form, keeping their last commit
    (`caramel.launch.elastic_rounds`)."""

    @abstractmethod
    def lost_peer(self, error: tf.errors.OpError) -> bool:
        """Whether `error`, raised by a collective, says that a peer was lost (its process or its
        connection gone): an elastic gang's ranks then re-form without it."""

    @abstractmethod
    def leave(self) -> None:
        """Leave the ranks at once, before they re-form (an elastic gang's ranks broke): this
        process's collectives fail, and a peer blocked on this rank fails then, instead of
        waiting for it."""

    def reform(self, contract: WorkerContract) -> Backend:
        """This process's collectives among the ranks `contract` gives now (an elastic gang that
        lost or took in workers), once it left the old ones (`leave`)."""
        raise NotImplementedError(f"the {self.name} backend's ranks do not re-form in the process")

    def copy_variable(self, copy: int) -> tf.Variable | None:
        """A variable that copy `copy` of a step in Caramel's graph of several steps reads where
        the trace read copy 0's, for backends that tell a graph's collectives apart by more than
        their ops' names (TensorFlow's instance keys); None where names suffice (Horovod's)."""
        return None

    def broadcast(self, tensors: Sequence[tf.Tensor], root_rank: int = 0, name: str = "caramel_broadcast") -> list[tf.Tensor]:
        """Rank `root_rank`'s values of the tensors, on every rank: a sum to which only the root
        contributes (exact, since every other rank adds zeros), in a dtype that sums exactly."""
        tensors = [tf.convert_to_tensor(tensor) for tensor in tensors]
        mine = self.rank == root_rank
        summed = [tf.cast(tensor, SUMMED_AS.get(tensor.dtype, tensor.dtype)) for tensor in tensors]
        reduced = self.all_reduce([tensor if mine else tf.zeros_like(tensor) for tensor in summed], ReduceOp.SUM, name)
        return [tf.cast(value, tensor.dtype) for value, tensor in zip(reduced, tensors)]

    def all_gather(self, tensor: tf.Tensor, name: str = "caramel_gather") -> tf.Tensor:
        """Every rank's `tensor` (of one shape on every rank), stacked along a new first axis in
        rank order."""
        tensor = tf.convert_to_tensor(tensor)
        placed = tf.scatter_nd([[self.rank]], tensor[tf.newaxis], tf.concat([[self.size], tf.shape(tensor)], axis=0))
        return self.all_reduce([placed], ReduceOp.SUM, name)[0]

    def probe(self, tensor: tf.Tensor) -> None:
        """The replanner's probe: an eager average of `tensor`, returned once done."""
        self.all_reduce([tensor], ReduceOp.AVERAGE, "caramel_probe")[0].numpy()


def horovod_installed() -> bool:
    """Whether the real Horovod, with its TensorFlow ops, is installed (beside Caramel's `horovod`)."""
    directory = real_horovod_dir()
    return directory is not None and os.path.isfile(os.path.join(directory, "tensorflow", "mpi_ops.py"))


def chosen(contract: WorkerContract) -> BackendChoice:
    """The backend the job's `spec.caramel.backend` asks for, with `auto` resolved: Horovod's
    collectives wherever Horovod is installed, whatever API the script uses (on these machines
    Gloo's ring moves a gradient byte for less CPU than TensorFlow's collectives over gRPC, and
    the zoo measured every path faster on it: benchmarks/README.md); TensorFlow's own where it is
    not."""
    wanted = contract.scheduling.backend
    if wanted is BackendChoice.HOROVOD and not horovod_installed():
        raise RuntimeError(
            "spec.caramel.backend is horovod, but Horovod is not installed here (make setup builds it, the image carries it); "
            "use backend tensorflow or auto"
        )
    if wanted is not BackendChoice.AUTO:
        return wanted
    return BackendChoice.HOROVOD if horovod_installed() else BackendChoice.TENSORFLOW


def set_up(choice: BackendChoice, contract: WorkerContract) -> Backend:
    """Join the job's ranks on the backend chosen."""
    module = importlib.import_module(BACKENDS[choice])
    return module.set_up(contract)
