"""Horovod's elastic training (`hvd.elastic`), served by Caramel, as Horovod 0.28.1 documents it.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0)
    state.register_reset_callbacks([lambda: optimizer.learning_rate.assign(base_lr * hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            step(...)
            state.commit()

    train(state)

`run` runs the function after synchronizing the state from rank 0. Where a collective fails
because a peer was lost (`HorovodInternalError`), every survivor restores its last commit, the
ranks re-form without the lost worker, synchronize and call the function again; where a worker
waits to join, `commit()` (or `check_host_updates()`) raises `HostsUpdatedInterrupt` on every rank
at once, and they re-form with it, keeping their state. On the horovod backend the ranks re-form in
the process, at the gang's rendezvous (`caramel.launch.elastic_rounds`): no process restarts. On the
tensorflow backend, whose collectives serve one cluster per process, each survivor's training
process runs its command again in its place, holding the last commit: the script starts over, and
where it enters `run` the state takes the commit back before it is synchronized (the states below;
a State of the script's own cannot be carried so, and is refused there). A gang runs elastic where
spec.workers.minReplicas is below replicas; otherwise `run` runs the function once, as a fixed
gang (rank 0 says which).

A commit copies the state into the process's memory: the variables' values, and every other
attribute of the state pickled (as `broadcast_object` sends them), so that a restore undoes what
came after, and an object that cannot be pickled fails at the commit, naming it.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np
import tensorflow as tf

import horovod.tensorflow as _hvd
from caramel.contract.elastic import elastic_notice, fixed_notice
from caramel.launch import elastic_rounds
from caramel.launch.elastic_rounds import Round
from caramel.tensorflow.runtime import current
from horovod._caramel_support import refuse
from horovod.tensorflow import _caramel_final_check, _caramel_horovod_ops
from horovod.tensorflow.functions import _pickler, broadcast_object, broadcast_object_fn, broadcast_variables, global_variables

try:  # Horovod's own classes where Horovod is installed, so that scripts catching them by either name catch them
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
except ImportError:

    class HorovodInternalError(RuntimeError):  # type: ignore[no-redef]
        """A collective failed: a peer was lost. The elastic ranks roll back to their last commit and re-form."""

    class HostsUpdatedInterrupt(RuntimeError):  # type: ignore[no-redef]
        """Workers joined (or left): the elastic ranks re-form with them, keeping their state."""

        def __init__(self, skip_sync: bool) -> None:
            super().__init__()
            self.skip_sync = skip_sync


__all__ = [
    "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState",
    "broadcast_object", "broadcast_object_fn", "broadcast_variables", "init", "rank", "run", "run_fn", "shutdown",
]  # fmt: skip


def init(*args: Any, **kwargs: Any) -> None:
    _hvd.init(*args, **kwargs)


def rank() -> int:
    return _hvd.rank()


def shutdown() -> None:
    _hvd.shutdown()


class State:
    """State kept in memory across the ranks of an elastic gang (Horovod's
    `horovod.common.elastic.State`): what `commit()` saves, `restore()` rolls back to, and
    `sync()` takes from rank 0."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called after the ranks re-formed (a worker lost or taken in), before the
        state is synchronized: to scale the learning rate with the new `hvd.size()`, say."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in memory (what a lost worker's peers roll back to), then raise
        `HostsUpdatedInterrupt` where workers wait to join."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank at once where workers wait at the
        rendezvous to join: rank 0 asks, and every rank takes its answer."""
        if not current().contract.may_run_short:
            return
        waiting = bool(elastic_rounds.newcomers(current().contract)) if self._rank() == 0 else False
        if self._bcast_object(waiting):
            raise HostsUpdatedInterrupt(False)  # the newcomers need the state: synchronize it

    # What each kind of state keeps: defined by the subclasses below, as in Horovod's State, whose
    # base class a script may subclass itself.
    def save(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define save(): what commit() keeps")

    def restore(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define restore(): back to the last commit")

    def sync(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define sync(): rank 0's state on every rank")

    def reset(self) -> None:
        """Reset objects after the ranks re-formed, before the state is synchronized."""


class ObjectState(State):
    """State of Python objects, each given as a keyword argument and kept as an attribute."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state = _pickled(kwargs, "hvd.elastic state")
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = _pickled({name: getattr(self, name) for name in self._saved_state}, "state.commit()")

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, _pickler.loads(value))

    def _caramel_carried(self) -> dict[str, Any]:
        """The last commit, as a process restarted to re-form takes it back (`_caramel_resume`)."""
        return {"objects": self._saved_state}

    def _caramel_resume(self, carried: dict[str, Any]) -> None:
        """Back to the last commit of this process's former self (its `_caramel_carried()`)."""
        self._saved_state = carried["objects"]
        self.restore()


def _pickled(values: dict[str, Any], where: str) -> dict[str, bytes]:
    """Each attribute's value pickled: a copy to roll back to and to send, made now."""
    saved = {}
    for name, value in values.items():
        try:
            saved[name] = _pickler.dumps(value)
        except Exception as error:
            raise TypeError(
                f"{where}: state.{name} ({type(value).__name__}) cannot be committed: an elastic state's attributes must "
                f"pickle, since a commit copies them and a sync sends them to the ranks that join ({error})"
            ) from error
    return saved


class _VariablesState(ObjectState):
    """State of TensorFlow variables (those `variables()` gives, asked each time), and of Python
    objects given as keyword arguments: a commit copies the variables' values too, a restore
    assigns them, a sync takes rank 0's."""

    def __init__(self, variables: Callable[[], list[tf.Variable]], **kwargs: Any) -> None:
        self._variables = variables
        self._values = _values(variables())
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        self._values = _values(self._variables())
        super().save()

    def restore(self) -> None:
        _assign(self._variables(), self._values)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._values = _values(self._variables())
        super().sync()

    def _caramel_carried(self) -> dict[str, Any]:
        return {**super()._caramel_carried(), "values": self._values}

    def _caramel_resume(self, carried: dict[str, Any]) -> None:
        values = carried["values"]
        if len(values) != len(self._variables()):
            raise RuntimeError(
                f"hvd.elastic: the state holds {len(self._variables())} variables, and the commit this process kept before "
                f"it restarted to re-form holds {len(values)}: the script must make the same variables each time it starts"
            )
        self._values = values
        super()._caramel_resume(carried)


class TensorFlowState(_VariablesState):
    """State of TensorFlow variables (every variable of the process where none are given), and
    of Python objects given as keyword arguments."""

    def __init__(self, variables: Iterable[tf.Variable] | None = None, session: Any = None, **kwargs: Any) -> None:
        if session is not None:
            refuse("hvd.elastic.TensorFlowState(session=...)", "TensorFlow 1 sessions are gone; give the variables, eagerly")
        self.variables = list(variables) if variables is not None else global_variables()
        super().__init__(lambda: self.variables, **kwargs)


class TensorFlowKerasState(_VariablesState):
    """State of a Keras model and its optimizer (the model's own where none is given), and of
    Python objects given as keyword arguments."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        del backend  # TensorFlow 1's session provider
        if not getattr(model, "built", False):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise ValueError("hvd.elastic state: give the optimizer, or compile the model with it")
        super().__init__(self._model_and_optimizer_variables, **kwargs)

    def _model_and_optimizer_variables(self) -> list[tf.Variable]:
        """The model's variables and the optimizer's, built first where Keras builds them lazily,
        so that a rank that joins holds as many as the others."""
        if not (getattr(self.optimizer, "built", False) or getattr(self.optimizer, "_built", False)):  # Keras 3's flag, Keras 2's
            self.optimizer.build(self.model.trainable_variables)
        variables = self.optimizer.variables
        return [*self.model.variables, *(variables() if callable(variables) else variables)]


def _values(variables: list[tf.Variable]) -> list[np.ndarray]:
    return [variable.numpy() for variable in variables]


def _assign(variables: list[tf.Variable], values: list[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """`func(state, ...)` run elastic: after each failure of a lost peer the state restored and
    `reset()`, after each interrupt for workers that joined `reset()` alone, then run again from
    the synchronized state. In a fixed gang, once. Where the ranks re-form by restarting the
    training processes, the restart takes `reset()`'s place, carrying the last commit."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not _enter():
            state.sync()
            return func(state, *args, **kwargs)
        restarting = None if current().backend.reforms else _resumed(state)
        skip_sync = False
        while True:
            failure: list[BaseException] = []
            try:
                if not skip_sync:
                    with _lost_peers_raised():
                        state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as error:
                failure.append(error)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            if restarting is not None:
                _restart_keeping(_pickler.dumps(restarting._caramel_carried()))
            _let_go_aside(failure)
            reset()
            state.on_reset()

    return wrapper


def _resumed(state: State) -> ObjectState:
    """Where the ranks re-form by restarting the training processes: the state, back to the last
    commit that this process kept before it restarted, if it did, and reset as after a re-form in
    the process (the restart was the re-form); refused where the restart cannot carry its commits."""
    if not isinstance(state, ObjectState):
        refuse(
            f"hvd.elastic.run with a State of the script's own ({type(state).__name__}) on the tensorflow backend",
            "its ranks re-form by restarting the training processes, and Caramel carries only ObjectState's commits "
            "(ObjectState, TensorFlowState, TensorFlowKerasState, KerasState) across the restart; derive the state from "
            "one of those, or run on backend horovod, whose ranks re-form in the process",
        )
    carried = elastic_rounds.carried_commit()
    if carried is not None:
        if carried.round:
            _say_reformed(carried.round, f", their training processes restarted with the last commit ({current().backend.name} backend) "
                          f"{carried.seconds_since_broken:.1f} s after the ranks broke")  # fmt: skip
        state._caramel_resume(_pickler.loads(carried.commit))
        state.on_reset()
    return state


def _let_go_aside(failure: list[BaseException]) -> None:
    """Let go of a failed step's exception (the only reference left to it is in `failure`) in a
    thread of its own. Its traceback holds the step's frames, and freeing them can wait seconds
    for a Keras fit's data iterator to stop its threads, while the survivors should meet at once
    (benchmarks/results/2026-11-29-keras-elastic-reform-time.txt)."""
    if failure:
        threading.Thread(target=failure.clear, name="caramel-failed-step", daemon=True).start()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of the elastic training function `func(state, ...)` (Horovod's `hvd.elastic.run`)."""

    def failing_as_horovod(state: State, *args: Any, **kwargs: Any) -> Any:
        with _lost_peers_raised():
            return func(state, *args, **kwargs)

    return run_fn(functools.wraps(func)(failing_as_horovod), _reform)


# -- the runtime's ranks re-formed at the rendezvous's rounds (caramel.launch.elastic_rounds) -----

_entered = False
"""Whether this process entered `hvd.elastic.run` before."""


def _enter() -> bool:
    """Whether the gang runs elastic (spec.workers.minReplicas below replicas), checked where a
    script enters `hvd.elastic.run`: refused with Caramel's own TrainingRun; rank 0 says which, once."""
    global _entered
    runtime = current()
    runtime.drive(
        "hvd.elastic.run",
        "TrainingRun rolls back to its checkpoint, restarting the whole gang; train either with hvd.elastic "
        "(its ranks re-form in the process, from the last commit) or with TrainingRun",
    )
    workers = runtime.contract.full_world_size // runtime.contract.slots_per_worker
    elastic = runtime.contract.may_run_short
    if elastic and _caramel_horovod_ops.registered():
        refuse("process sets in an elastic gang", "a process set is of one set of ranks, which the gang re-forms: use them "
               "in a fixed gang (spec.workers.minReplicas equal to replicas), or train elastic without them")  # fmt: skip
    first, _entered = not _entered, True
    if elastic:
        runtime.metrics.record_elastic()  # the operator then replaces a lost worker instead of restarting the gang
    if elastic and first and not runtime.backend.reforms:
        elastic_rounds.watch_for_broken_ranks(runtime.contract, runtime.backend.leave)
    elif elastic and first and elastic_rounds.round_number() == 0:
        # The gang formed with the start-up timeout; every rank enters here at once, and forms
        # the same ranks again with the peer timeout, without the rendezvous.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(elastic_rounds.PEER_TIMEOUT_SECONDS)
        runtime.reform(lambda: None)
        _caramel_final_check.rearm()
    if first and elastic_rounds.round_number() == 0:  # a process restarted to re-form said it before
        runtime.say(elastic_notice(workers, runtime.contract.min_workers) if elastic else fixed_notice(workers))
    return elastic


@contextmanager
def _lost_peers_raised() -> Iterator[None]:
    """A collective that failed because a peer was lost (as the backend tells) raised as Horovod's
    HorovodInternalError."""
    try:
        yield
    except tf.errors.OpError as error:
        backend = current().backend
        if backend.lost_peer(error):
            # Leave the broken ranks now, not once the failed step is freed (a Keras fit's data
            # iterator can take seconds): a peer blocked on this rank fails at once instead of
            # after the peer timeout.
            backend.leave()
            raise HorovodInternalError(error) from error
        raise


def _reform() -> None:
    """Re-form the ranks in this process with the workers alive, met at the rendezvous's next round."""
    runtime = current()
    started = time.monotonic()
    met: list[Round] = []
    runtime.reform(lambda: met.append(elastic_rounds.meet(runtime.contract, runtime.backend.local_rank, after=elastic_rounds.round_number())))
    # Horovod's init registered its shutdown at exit again: the weights check must run before it.
    _caramel_final_check.rearm()
    _say_reformed(met[0], f" after {time.monotonic() - started:.1f} s")


def _restart_keeping(commit: bytes) -> NoReturn:
    """Re-form the ranks by restarting this training process, keeping the last commit."""
    runtime = current()
    runtime.say(f"the ranks broke: the training processes restart to re-form ({runtime.backend.name} backend), keeping the last commit")
    elastic_rounds.restart_keeping(commit)


def _say_reformed(met: Round, how: str) -> None:
    workers = ", ".join(member.name for member in met.hosts)
    current().say(f"ranks re-formed in round {met.number} of the rendezvous: {met.world_size} ranks ({workers}){how}")

