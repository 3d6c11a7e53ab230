"""The process's place in the job: Horovod's ranks and the one gradient communicator."""

from __future__ import annotations

import horovod.tensorflow as hvd

from caramel.job.contract import WorkerContract
from caramel.tensorflow.communicator import GradientCommunicator

_communicator: GradientCommunicator | None = None


def init() -> WorkerContract:
    """Join the job's Horovod ranks; call once per process before any other Caramel call."""
    global _communicator
    contract = WorkerContract.from_env()
    hvd.init()
    _communicator = GradientCommunicator(contract)
    return contract


def communicator() -> GradientCommunicator:
    if _communicator is None:
        raise RuntimeError("caramel.tensorflow.init() must be called first")
    return _communicator


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()
