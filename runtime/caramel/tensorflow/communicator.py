"""Gradient communication for the tape and optimizer drop-ins.

Inside a graph (a `tf.function`, a Keras train function, `caramel.tensorflow.function`), the
gradients are averaged by the transfers of the plan in force, built into the graph as Horovod
collectives when the step is traced (`collectives.py`): there is no Python on the step's path.
The graph also stamps when each gradient exists and each transfer ends (`stamps.py`); read
between executions, the stamps give the step's timings (`caramel.planner.timing`), which feed
the metrics and the replanner. Eagerly, the gradients go to Horovod as one grouped allreduce.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from caramel.job.api import Allreduce, Collective, Tuning
from caramel.job.contract import WorkerContract
from caramel.planner.linkmodel import LinkModel
from caramel.planner.timing import StepStamps, StepTimes, execution_times
from caramel.tensorflow.collectives import Chain, HorovodAverage, Reduce, run_split_transfers, run_transfers
from caramel.tensorflow.cycle import CycleTuner
from caramel.tensorflow.multitree import TreeReduce
from caramel.tensorflow.replanner import Replanner
from caramel.tensorflow.stamps import StampBook
from caramel.topology.simulate import choose_allreduce
from caramel.topology.transport import SUPPORTED_DTYPES

# The link assumed before any transfer was timed: a gigabit link with a millisecond per collective.
INITIAL_LINK = LinkModel(alpha=1e-3, beta=1 / 125e6)


def initial_link(tuning: Tuning | None) -> LinkModel:
    """The link a restarted gang measured last, or a cautious guess."""
    if tuning and tuning.alpha_seconds is not None and tuning.beta_seconds_per_byte is not None:
        return LinkModel(alpha=tuning.alpha_seconds, beta=tuning.beta_seconds_per_byte)
    return INITIAL_LINK


@dataclass
class _Trace:
    """What the communicator keeps of one graph while it is traced: steps chain their transfers."""

    chain: Chain = field(default_factory=Chain)
    steps: int = 0
    horovod_average: HorovodAverage = field(default_factory=HorovodAverage)
    """Horovod's all-reduce, which counts the tensors the graph hands it."""


class GradientCommunicator:
    """Averages gradients across all ranks, by the plan in force, with the job's all-reduce
    algorithm (Horovod's ring, or MULTITREE's trees over the job's topology)."""

    def __init__(self, contract: WorkerContract) -> None:
        self.contract = contract
        self.scheduling = contract.scheduling
        self.replanner = Replanner(contract.scheduling, initial_link(contract.tuning))
        self.cycle = CycleTuner()
        self.algorithm: str | None = None
        """ring or multitree, chosen when the first graph's gradients are seen."""
        self._tree_reduce: Reduce | None = None
        """MULTITREE's trees, where chosen; else each graph's `HorovodAverage`."""
        self._stamps = StampBook()

    def allreduce(self, gradients: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The average of every (dense) gradient over all ranks."""
        if tf.executing_eagerly() or not all(g.shape.is_fully_defined() for g in gradients):
            # Eagerly there is no graph to plan; shapes known only at run time cannot be planned.
            return list(hvd.grouped_allreduce(list(gradients), op=hvd.Average, name="caramel_gradients"))
        plan = self.replanner.plan_for([(g.shape.num_elements() * g.dtype.size, g.dtype.size) for g in gradients])
        if self.algorithm is None:
            self._choose_algorithm(gradients)
        trace = self._trace()
        stamps = [self._stamps.stamp()]  # the execution's start, for its first step
        if self.scheduling.collective is Collective.SPLIT:
            averaged, issued = run_split_transfers(gradients, plan.transfers, trace.chain)
        else:
            averaged, issued = run_transfers(gradients, plan.transfers, trace.chain, self._tree_reduce or trace.horovod_average)
        stamps += [self._stamps.stamp(transfer.ready) for transfer in issued]
        stamps += [self._stamps.stamp(transfer.done) for transfer in issued]
        if trace.steps == 0:
            stamps += [self._stamps.stamp(gradient) for gradient in gradients]
        self._stamps.write(trace.steps, stamps)
        trace.steps += 1
        return averaged

    def _choose_algorithm(self, gradients: Sequence[tf.Tensor]) -> None:
        """Ring, or MULTITREE where asked for, or where `auto` predicts it clearly faster on the
        job's topology for this model's gradients (never on a flat topology)."""
        wanted = self.scheduling.allreduce
        nbytes = sum(g.shape.num_elements() * g.dtype.size for g in gradients)
        movable = all(np.dtype(g.dtype.as_numpy_dtype).name in SUPPORTED_DTYPES for g in gradients)
        if wanted is Allreduce.MULTITREE and not movable:
            raise ValueError(
                f"spec.caramel.allreduce: multitree moves gradients of {', '.join(SUPPORTED_DTYPES)} only, and this "
                f"model has {sorted({g.dtype.name for g in gradients})}; use ring or auto"
            )
        if wanted is Allreduce.MULTITREE or (wanted is Allreduce.AUTO and movable and choose_allreduce(self.contract.topology, nbytes) == "multitree"):
            self.algorithm = "multitree"
            tree_reduce = TreeReduce(self.contract, hvd.rank())
            self._tree_reduce = tree_reduce
            self.replanner.probe_allreduce = tree_reduce.allreduce_now  # the plans are for the trees' link
        else:
            self.algorithm = "ring"
        if hvd.rank() == 0:
            print(f"caramel: gradients all-reduced by {self.algorithm} (spec.caramel.allreduce: {wanted.value})", file=sys.stderr, flush=True)

    @staticmethod
    def _trace() -> _Trace:
        """The trace of the graph being built, kept on the graph itself: a trace holds the
        graph's tensors, so a mapping keyed weakly by graph would keep every graph ever traced
        alive (about 50 MB per re-trace of one emulated ResNet-50 step)."""
        graph = tf.compat.v1.get_default_graph()
        if not hasattr(graph, "_caramel_trace"):
            graph._caramel_trace = _Trace()
        return graph._caramel_trace

    def prepare(self, steps: int) -> None:
        """Before a graph of `steps` steps is traced for the plan in force: make the variables
        its stamps go to now, so that tracing makes none (tf.function would trace the graph
        twice, tens of seconds for a few unrolled steps of a large model)."""
        plan = self.replanner.plan
        if plan is not None:
            for slot in range(steps):
                self._stamps.reserve(slot, self._stamps_per_step(slot, len(plan.transfers)))

    def _stamps_per_step(self, slot: int, transfers: int) -> int:
        """The execution's start, each transfer's readiness and end, and in the execution's
        first step each gradient's release."""
        return 1 + 2 * transfers + (self.replanner.gradients if slot == 0 else 0)

    def measure(self, steps: int) -> list[StepTimes]:
        """The timings of the steps of the execution just run (`steps` of them, graph steps
        only: none after an eager step), and hands them to the replanner."""
        plan = self.replanner.plan
        if plan is None:
            return []
        transfers = len(plan.transfers)
        stamps = []
        for slot in range(steps):
            values = self._stamps.read(slot, self._stamps_per_step(slot, transfers))
            if values is None:
                return []
            stamps.append(
                StepStamps(
                    started=float(values[0]),
                    transfers_ready=tuple(values[1 : 1 + transfers]),
                    transfers_done=tuple(values[1 + transfers : 1 + 2 * transfers]),
                    releases=tuple(values[1 + 2 * transfers :]) if slot == 0 else None,
                )
            )
        times = execution_times(stamps, plan.transfers)
        self.replanner.observe(times)
        return times
