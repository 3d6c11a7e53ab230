"""Gradient communication for the tape and optimizer drop-ins.

Where a step is traced decides how its gradients travel:
- in Caramel's own multi-step executions (`caramel.tensorflow.function`, `TrainingRun.fit`, the
  Keras callback), two ways to average them are built into the step's graph as the branches of
  one `switch_case`:
  - the backend's own way (`Backend.own_way`): on Horovod each gradient its own allreduce, as
    `hvd.DistributedGradientTape` sends them, fused by Horovod's background thread; on TensorFlow
    one packed collective, as MultiWorkerMirroredStrategy sends them; no order, no stamps;
  - the plan in force: its transfers as the backend's collectives (`planned_transfers.py`), in its order and
    window, with stamps of when each transfer's gradients existed and when it ended
    (`stamps.py`), which, read between executions, give the step's timings
    (`caramel.planner.timing`) for the metrics and the replanner.
  The selector (`selector.py`) picks the branch of every step by measured step time, in the
  graph: there is no Python on the step's path.
- in the backend's own graph of one step that `caramel.tensorflow.function` runs until it has
  measured a plan, and where the plan cannot repay Caramel's graph (steps.py), the backend's own
  way, with, while the replanner needs them, stamps of when each gradient existed beside the
  transfers: nothing waits for them, and no transfer waits for anything but its gradients;
- in any other graph (a `tf.function` the user calls once per step, Keras' own train function),
  the backend's own way alone, unless the gradients go through MULTITREE's trees (then as above).
  Such a function returns only once its last transfer has ended, so the next step's forward
  pass cannot start earlier whatever the order of the transfers: on the ring the plan has
  nothing to gain there, and measured slower than Horovod's own way in such functions
  (benchmarks/README.md). The step is then exactly the backend's own.
- eagerly, the gradients go to the backend as one fused all-reduce.

A gradient whose static shape is not fully defined has no size to plan by: it goes on its own,
the backend's way, and every other gradient of the step as above (`_apart`).

The branches move bytes and do nothing else: the outputs of a branch, and of a function, wait
for all of its side effects, so a stamp of the last transfer inside one would hold every averaged
gradient back until that transfer ended, and with them the next step's forward pass. The
stamps are taken beside the branches, where the plan ran.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import tensorflow as tf

from caramel.allreduce.simulate import choose_allreduce
from caramel.collectives.backend import Backend, ReduceOp
from caramel.collectives.multitree import MultitreeReduce
from caramel.collectives.tree_transport import SUPPORTED_DTYPES
from caramel.contract.api import Allreduce, Tuning
from caramel.contract.env import WorkerContract
from caramel.network.wire import job_topology
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import Collective, PlanningPolicy
from caramel.planner.timing import StepStamps, StepTimes, backward_seconds_from_releases, execution_times
from caramel.tensorflow.graph_choice import CARAMEL
from caramel.tensorflow.planned_transfers import Chain, run_split_transfers, run_transfers
from caramel.tensorflow.selector import OWN_WAY, PLANNED
from caramel.tensorflow.stamps import StampBook
from caramel.tensorflow.step_control import StepControl

# The name of the `switch_case` of the two ways (arms) in a step's graph.
ARMS_NAME = "caramel_arms"
OWN_GRAPH_SLOT = -1
"""The stamps' slot of the backend's own graph of one step (Caramel's graph uses 0 and up)."""
RELEASES = 2.0
"""The first stamp of a step of the own graph that stamped its gradients' releases (beside the
arms' OWN_WAY and PLANNED)."""
# The link assumed before any transfer was timed: a gigabit link with a millisecond per collective.
INITIAL_LINK = LinkModel(alpha=1e-3, beta=1 / 125e6)


def initial_link(tuning: Tuning | None) -> LinkModel:
    """The link a restarted gang measured last, or a cautious guess."""
    if tuning and tuning.alpha_seconds is not None and tuning.beta_seconds_per_byte is not None:
        return LinkModel(alpha=tuning.alpha_seconds, beta=tuning.beta_seconds_per_byte)
    return INITIAL_LINK


class GradientCommunicator:
    """Averages gradients across all ranks, by the arm the selector picks: the backend's own way,
    or the plan in force with the job's all-reduce algorithm (the backend's ring, or MULTITREE's
    trees over the job's topology), as `policy` says (Caramel's own way unless a benchmark or test
    gave another: `caramel.tensorflow.runtime.plan_with`)."""

    def __init__(self, contract: WorkerContract, backend: Backend, policy: PlanningPolicy = PlanningPolicy()) -> None:
        self.contract = contract
        self.backend = backend
        self.scheduling = contract.scheduling
        self.policy = policy
        if policy.collective is Collective.SPLIT and not hasattr(backend, "reduce_scatter"):
            raise ValueError(
                f"the planning policy's collective split needs reduce-scatter, which the {backend.name} backend has not on the CPU "
                "(TensorFlow's CollectiveReduceScatterV2 has no CPU kernel); use collective allreduce or backend horovod"
            )
        self.algorithm: str | None = None
        """ring or multitree, chosen when the first graph's gradients are seen."""
        self._trees: MultitreeReduce | None = None
        """MULTITREE's trees, where they average the plan's transfers instead of the backend."""
        self._stamps = StampBook()
        self._releases: tf.Variable | None = None
        """While Caramel's own steps are traced (None at any other time): whether the step stamps
        its gradients' releases (read in the graph; only the first step of an execution does,
        see `stamp_releases`)."""
        self._tracing_own_graph = False
        self._now_and_then = False
        """While a step traces gradients that it sends on some of its passes only (`now_and_then`)."""
        # The stamps' variables of the own graph and of the first step of Caramel's, made now: a
        # variable made while tf.function traces makes it trace the whole function twice.
        for slot in (OWN_GRAPH_SLOT, 0):
            self._stamps.reserve(slot)
        self._stamps.flag(OWN_GRAPH_SLOT, True)
        self.stamp_releases(0)
        self.control = StepControl(contract, backend, initial_link(contract.tuning), lambda: self.stamp_own_releases.assign(False), policy)
        """The decisions between executions: the plan in force (its replanner), the arm of each
        step (its selector), Caramel's graph or the own (its graph choice)."""

    def allreduce(self, gradients: Sequence[tf.Tensor], op: ReduceOp = ReduceOp.AVERAGE) -> list[tf.Tensor]:
        """Every (dense) gradient reduced over all ranks: averaged, or summed (op SUM)."""
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise ValueError(f"gradients are averaged or summed over the ranks, not reduced by {op.value}")
        if tf.executing_eagerly():
            return self.backend.all_reduce(list(gradients), op, "caramel_gradients")  # no graph to plan
        unshaped = [index for index, gradient in enumerate(gradients) if not gradient.shape.is_fully_defined()]
        if unshaped:
            return self._apart(gradients, unshaped, op)
        if self._now_and_then:
            return self.backend.own_way(gradients, op)
        if self.algorithm is None:
            self._choose_algorithm(gradients)
        if self._releases is None and self.algorithm == "ring":
            averaged = self.backend.own_way(gradients, op)  # a step of a graph Caramel does not build (see the module's docstring)
            if self._tracing_own_graph:
                self.control.replanner.plan_for([(g.shape.num_elements() * g.dtype.size, g.dtype.size) for g in gradients])  # the sizes to plan for
                self._stamp_releases_beside(gradients)
            return averaged
        if self._trees is not None and op is not ReduceOp.AVERAGE:
            raise ValueError("MULTITREE's trees average the gradients; summing them (op Sum) needs spec.caramel.allreduce: ring")
        reduce = self._trees or (lambda pieces, name: self.backend.all_reduce(pieces, op, name))
        plan = self.control.replanner.plan_for([(g.shape.num_elements() * g.dtype.size, g.dtype.size) for g in gradients])
        count, transfers = len(gradients), plan.transfers

        def unplanned() -> list[tf.Tensor]:
            return [*self.backend.own_way(gradients, op), *(tf.zeros([1], gradients[t.pieces[0].tensor].dtype) for t in transfers)]

        def planned() -> list[tf.Tensor]:
            if self.policy.collective is Collective.SPLIT:
                averaged, done = run_split_transfers(gradients, transfers, Chain(), self.backend)
            else:
                averaged, done = run_transfers(gradients, transfers, Chain(), reduce)
            return [*averaged, *(tf.reshape(output, [-1])[:1] for output in done)]

        start = self._stamps.stamp()  # the execution's start (no input: it runs first), for its first step
        # The arm was chosen when the step before ended, so it is there before any gradient is.
        arm = self.control.selector.arm.read_value()
        outputs = tf.switch_case(arm, [unplanned, planned], name=ARMS_NAME)
        averaged, done = outputs[:count], outputs[count:]
        ready = []  # per transfer, a tensor that exists once all of its gradients do
        for transfer in transfers:
            with tf.control_dependencies([gradients[piece.tensor] for piece in transfer.pieces]):
                ready.append(tf.identity(gradients[transfer.pieces[0].tensor]))
        stamps = tf.cond(tf.equal(arm, PLANNED), lambda: self._stamped(start, gradients, ready, done), lambda: tf.constant([OWN_WAY], tf.float64))
        self._stamps.reserve(0).assign(stamps)
        # The step's time runs from when the step before released its last gradient to when
        # this one does: a point of every step that no transfer holds up.
        with tf.control_dependencies(gradients):
            self.control.selector.tick(tf.identity(gradients[0]))
        return list(averaged)

    def _apart(self, gradients: Sequence[tf.Tensor], unshaped: Sequence[int], op: ReduceOp) -> list[tf.Tensor]:
        """The gradients, those at `unshaped` each sent on its own, the backend's way, and the
        others as they would go without them. A gradient whose shape is known only at run time
        (a `tf.py_function`'s without `set_shape`, a custom op's without a shape function) has no
        size to plan or to bucket by; sent with the others it would hold every one of them until
        it exists. Its collective is traced after theirs: TensorFlow's collectives run in the order
        traced, so it waits for theirs, and none of theirs for it."""
        apart = set(unshaped)
        shaped = [index for index in range(len(gradients)) if index not in apart]
        averaged = dict(zip(shaped, self.allreduce([gradients[index] for index in shaped], op))) if shaped else {}
        for index in unshaped:
            averaged[index] = self.backend.all_reduce([gradients[index]], op, f"caramel_unshaped_gradient_{index}")[0]
        return [averaged[index] for index in range(len(gradients))]

    @property
    def runs_plan(self) -> bool:
        """Whether the steps send their gradients by the plan (not the backend's own way, in
        Caramel's graph or in the backend's own)."""
        return self.control.graphs.running == CARAMEL and self.control.selector.planned

    def _stamped(self, start: tf.Tensor, gradients: Sequence[tf.Tensor], ready: Sequence[tf.Tensor], done: Sequence[tf.Tensor]) -> tf.Tensor:
        """The stamps of a step that ran the plan: its execution's start, when each transfer's
        gradients all existed (`ready`) and when it ended (`done`), and where `stamp_releases`
        says so, when each gradient existed. They are taken outside the branch that moves the
        bytes: a branch's outputs wait for all of its side effects, so stamps in it would hold
        every averaged gradient until the last transfer ended."""
        stamped = tf.stack([start, *(self._stamps.stamp(marker) for marker in [*ready, *done])])
        if self._releases is not None:
            stamped = tf.cond(
                self._releases.read_value(),
                lambda: tf.concat([stamped, tf.stack([self._stamps.stamp(gradient) for gradient in gradients])], axis=0),
                lambda: stamped,
            )
        return tf.concat([tf.constant([PLANNED], tf.float64), stamped], axis=0)

    def _stamp_releases_beside(self, gradients: Sequence[tf.Tensor]) -> None:
        """In the own graph: when each gradient existed, where `stamp_own_releases` says so,
        kept in the own graph's slot. The stamps read the gradients and nothing reads the stamps
        but their variable's assignment: no transfer waits for them."""
        start = self._stamps.stamp()

        def stamped() -> tf.Tensor:
            releases = tf.stack([self._stamps.stamp(gradient) for gradient in gradients])
            return tf.concat([tf.constant([RELEASES], tf.float64), tf.reshape(start, [1]), releases], axis=0)

        stamps = tf.cond(self.stamp_own_releases.read_value(), stamped, lambda: tf.constant([OWN_WAY], tf.float64))
        self._stamps.reserve(OWN_GRAPH_SLOT).assign(stamps)

    @property
    def stamp_own_releases(self) -> tf.Variable:
        """Whether the own graph of one step stamps its gradients' releases (until the first plan
        is decided: the replanner's release times)."""
        return self._stamps.flag(OWN_GRAPH_SLOT, True)

    @contextmanager
    def now_and_then(self) -> Iterator[None]:
        """While a step traces the gradients it sends on some of its passes only (local gradient
        accumulation sends them every Nth pass): they go the backend's own way, unplanned and
        unstamped, since a plan and the measurements it is made from are of steps that each send
        every gradient."""
        self._now_and_then = True
        try:
            yield
        finally:
            self._now_and_then = False

    @contextmanager
    def tracing_own_graph(self) -> Iterator[None]:
        """While the backend's own graph of one step is traced for `caramel.tensorflow.function`:
        its gradients go the backend's own way, with their releases stamped beside them."""
        self._tracing_own_graph = True
        try:
            yield
        finally:
            self._tracing_own_graph = False

    def measure_own_step(self) -> None:
        """Hands the release times the own graph's last step stamped, if it did, to the replanner."""
        values = self._stamps.read(OWN_GRAPH_SLOT)
        if values is not None and values.size and values[0] == RELEASES:
            self.control.replanner.observe_releases(backward_seconds_from_releases(values[2:].tolist(), started=float(values[1])))

    @contextmanager
    def tracing_steps(self) -> Iterator[tf.Variable]:
        """While Caramel's own multi-step executions trace their step: the step runs the arm the
        selector picks, and stamps its gradients' releases, for the replanner, where the
        variable given says so (a step traced anywhere else runs the backend's own way)."""
        self._releases = self.stamp_releases(0)
        try:
            yield self._releases
        finally:
            self._releases = None

    def stamp_releases(self, slot: int) -> tf.Variable:
        """Whether the step at position `slot` of an execution stamps its gradients' releases:
        the first does (once per execution is enough for the planner, and stamps cost ops)."""
        return self._stamps.flag(slot, slot == 0)

    def slot_variables(self, slot: int) -> list[tf.Variable]:
        """The variables the step at position `slot` of an execution reads where the trace (the
        first step's) read slot 0's: where it keeps its stamps, whether it stamps its gradients'
        releases (only the first does), and what the backend tells copies apart by."""
        copy = self.backend.copy_variable(slot)
        return [self._stamps.reserve(slot), self.stamp_releases(slot), *([copy] if copy is not None else [])]

    def _choose_algorithm(self, gradients: Sequence[tf.Tensor]) -> None:
        """Ring, or MULTITREE where asked for, or where `auto` predicts it clearly faster on the
        job's topology for this model's gradients (never on a flat topology). Never MULTITREE
        for a gang that may run short (an elastic script's ranks re-form without a lost worker):
        its trees, and the graphs traced with them, are of one set of ranks, and a peer lost on
        them fails a step as any error does, not as a lost peer the ranks re-form without."""
        wanted = self.scheduling.allreduce
        nbytes = sum(g.shape.num_elements() * g.dtype.size for g in gradients)
        movable = all(np.dtype(g.dtype.as_numpy_dtype).name in SUPPORTED_DTYPES for g in gradients)
        if wanted is Allreduce.MULTITREE and not movable:
            raise ValueError(
                f"spec.caramel.allreduce: multitree moves gradients of {', '.join(SUPPORTED_DTYPES)} only, and this "
                f"model has {sorted({g.dtype.name for g in gradients})}; use ring or auto"
            )
        why = ""
        if self.contract.may_run_short and wanted is not Allreduce.RING:
            self.algorithm = "ring"
            why = ": this gang may run short (spec.workers.minReplicas), and its ranks then re-form, which MULTITREE's trees cannot follow"
        elif wanted is Allreduce.MULTITREE or (wanted is Allreduce.AUTO and movable and choose_allreduce(job_topology(self.contract), nbytes) == "multitree"):
            self.algorithm = "multitree"
            self._trees = MultitreeReduce(self.contract, self.backend.rank)
        else:
            self.algorithm = "ring"
        self.control.use_algorithm(self.algorithm, self._trees.allreduce_now if self._trees else None)  # the plans are for the trees' link
        if self.backend.rank == 0:
            print(f"caramel: gradients all-reduced by {self.algorithm} (spec.caramel.allreduce: {wanted.value}){why}", file=sys.stderr, flush=True)

    def measure(self, steps: int) -> list[StepTimes]:
        """The timings of the steps of the execution just run (`steps` of them), if they ran the
        plan in force, and hands them to the replanner; [] if they ran the backend's own way (which
        stamps nothing) or communicated eagerly."""
        plan = self.control.replanner.plan
        if plan is None:
            return []
        transfers = len(plan.transfers)
        stamps = []
        for slot in range(steps):
            values = self._stamps.read(slot)
            if values is None or values.size == 0 or values[0] != PLANNED:
                return []
            values = values[1:]
            stamps.append(
                StepStamps(
                    started=float(values[0]),
                    transfers_ready=tuple(values[1 : 1 + transfers]),
                    transfers_done=tuple(values[1 + transfers : 1 + 2 * transfers]),
                    releases=tuple(values[1 + 2 * transfers :]) if len(values) > 1 + 2 * transfers else None,
                )
            )
        times = execution_times(stamps, plan.transfers)
        self.control.replanner.observe(times)
        return times
