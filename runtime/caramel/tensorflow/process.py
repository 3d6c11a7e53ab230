"""The process's place in the job: Horovod's ranks and the one gradient communicator."""

from __future__ import annotations

import os

import horovod.tensorflow as hvd

from caramel.job.contract import WorkerContract
from caramel.tensorflow.communicator import GradientCommunicator

_communicator: GradientCommunicator | None = None
# Horovod caches the negotiation of this many tensors (its default is 1024). A graph of several
# steps hands it each step's tensors under names of their own, and every step two ways to send
# them (Horovod's own and the plan's): an emulated NASNet-Mobile (742 parameter tensors) at four
# steps per graph names some 6,000. Beyond the cache, every tensor is negotiated in full, every
# step. A cache this size costs nothing while unused: Horovod's ranks agree on the entries in use.
RESPONSE_CACHE_CAPACITY = 16384


def init() -> WorkerContract:
    """Join the job's Horovod ranks; call once per process before any other Caramel call."""
    global _communicator
    contract = WorkerContract.from_env()
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", str(RESPONSE_CACHE_CAPACITY))
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
