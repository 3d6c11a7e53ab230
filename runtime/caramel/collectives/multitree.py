"""Planned transfers all-reduced by MULTITREE's trees (`caramel.collectives.tree_transport`), from the graph.

With `spec.caramel.allreduce: multitree` (or `auto` where the job's topology makes it clearly
faster), each planned transfer is one call of the tree transport instead of a Horovod
collective: the plan's order, batching and window stay as they are. A call takes the transfer's
pieces as one flat buffer per dtype through `tf.numpy_function`; the transport moves the bytes
and adds them in its own threads, with the GIL released. Every call carries a sequence number
from a counter variable that each call increments in program order, so every rank numbers its
calls alike and the transport runs them in that order.
"""

from __future__ import annotations

import tensorflow as tf

from caramel.allreduce.multitree_schedule import multitree
from caramel.collectives.fusion import joined
from caramel.collectives.tree_transport import TreeTransport
from caramel.contract.env import WorkerContract
from caramel.network.wire import job_topology


class MultitreeReduce:
    """A `caramel.tensorflow.planned_transfers.Reduce` that runs the job's MULTITREE schedule between the ranks."""

    def __init__(self, contract: WorkerContract, rank: int) -> None:
        self._contract = contract
        self._rank = rank
        self._transport: TreeTransport | None = None
        with tf.init_scope():
            self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="caramel_tree_calls")

    def __call__(self, pieces: list[tf.Tensor], name: str) -> list[tf.Tensor]:
        transport = self._connected()  # at trace time: every rank traces its first step together

        def average(flat: tf.Tensor, flat_name: str) -> tf.Tensor:
            sequence = self._calls.assign_add(1, read_value=True) - 1
            averaged = tf.numpy_function(
                lambda buffer, number: transport.allreduce(buffer, int(number)), [flat, sequence], flat.dtype, stateful=False, name=flat_name
            )
            averaged.set_shape(flat.shape)
            return averaged

        return joined(pieces, name, average)

    def allreduce_now(self, tensor: tf.Tensor) -> object:
        """The average of `tensor` over the ranks, eagerly, between graph executions (the
        replanner's probes): numbered by the same counter as the graph's calls, so every rank
        still makes the same calls in the same order."""
        sequence = int(self._calls.assign_add(1, read_value=True).numpy()) - 1
        return self._connected().allreduce(tensor.numpy(), sequence)

    def _connected(self) -> TreeTransport:
        if self._transport is None:
            contract = self._contract
            self._transport = TreeTransport(multitree(job_topology(contract)), self._rank, contract.transport_addresses)
        return self._transport
