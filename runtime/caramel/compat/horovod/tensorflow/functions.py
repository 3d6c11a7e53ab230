"""Horovod's `horovod.tensorflow.functions`: variables and Python objects broadcast or gathered.

`broadcast_global_variables(root_rank)` is TensorFlow 1's call in TensorFlow 2's meaning: TensorFlow
2 keeps no collection of global variables, so it takes every variable the process holds, in the
order they were made (the same on every rank of one script), Caramel's own left out (they are each
rank's own: clocks, keys), and gives each rank root_rank's values; in a TensorFlow 1 graph it takes
the graph's global variables, as Horovod does.

Objects travel pickled (with cloudpickle where it is installed, as Horovod does, so that lambdas
and local classes travel too) as uint8 tensors: a broadcast sends the root's length first, and a
gather is the ragged allgather of every rank's bytes. Both run eagerly, as Horovod's do in TF2, or
in a TensorFlow 1 graph, in its session (the one given, or the default one), as Horovod's do there;
inside a tf.function, which has no session, they are refused.
"""

from __future__ import annotations

import gc
import pickle
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

import caramel.tensorflow as ctf
from horovod._caramel_support import refuse
from horovod.tensorflow import _caramel_final_check as final_check
from horovod.tensorflow import _caramel_horovod_ops as horovod_ops
from horovod.tensorflow._caramel_collectives import (
    backend,
    check_process_set,
    check_root,
    collective_name,
    gather_ragged,
    global_process_set,
    is_global,
)

try:
    import cloudpickle as _pickler
except ImportError:  # Horovod brings cloudpickle; without Horovod, pickle does for most objects
    _pickler = pickle


def broadcast_variables(variables: Iterable[Any], root_rank: int, process_set: Any = global_process_set, inplace: bool = False) -> None:
    """Overwrite the variables on every rank (of the process set: Horovod's ops) with rank
    root_rank's values (eagerly or in a graph)."""
    del inplace  # Horovod's choice of op; the variables are assigned either way
    check_root(root_rank, "hvd.broadcast_variables")
    variables = list(variables)
    if not is_global(process_set):  # the set's ranks alone: not the weights every rank ends with
        for i, variable in enumerate(variables):
            variable.assign(horovod_ops.broadcast(variable, root_rank, process_set, f"hvd_broadcast_variables_{i}"))
        return
    final_check.note_trained([variable for variable in variables if getattr(variable, "trainable", False)])
    ctf.broadcast_variables(variables, root_rank)


def broadcast_global_variables(root_rank: int) -> None:
    """Every variable of the process (Caramel's own left out) takes rank root_rank's value, eagerly;
    in a TensorFlow 1 graph, its global variables, as in Horovod."""
    if not tf.executing_eagerly():
        if tf.compat.v1.get_default_graph().building_function:
            refuse("hvd.broadcast_global_variables inside a tf.function", "call it eagerly, once the variables exist")
        broadcast_variables(tf.compat.v1.global_variables(), root_rank)
        return
    check_root(root_rank, "hvd.broadcast_global_variables")
    variables = global_variables()
    collectives = backend()
    counts = collectives.all_gather(tf.constant(len(variables), tf.int64), name="hvd_broadcast_global_variables_count").numpy().tolist()
    if len(set(counts)) != 1:
        raise ValueError(f"hvd.broadcast_global_variables: the ranks hold different numbers of variables ({counts}, by rank): "
                         "broadcast the variables of the model and the optimizer with hvd.broadcast_variables instead")
    broadcast_variables(variables, root_rank)


def global_variables() -> list[tf.Variable]:
    """Every tf.Variable alive in the process, in the order they were made (each one's unique id
    ends in a number TensorFlow counts up), Caramel's own (named caramel_*) left out."""
    gc.collect()  # variables of garbage not yet collected would differ from rank to rank
    found = [obj for obj in gc.get_objects() if isinstance(obj, tf.Variable) and not _is_caramels(obj)]
    return sorted(found, key=lambda variable: int(re.findall(r"\d+$", variable._unique_id)[0]))


def _is_caramels(variable: tf.Variable) -> bool:
    return variable.name.rsplit("/", 1)[-1].startswith("caramel_")


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None, process_set: Any = global_process_set) -> Any:
    """Rank root_rank's `obj`, on every rank (the root gets its own object back)."""
    session = _session("hvd.broadcast_object", session, process_set)
    check_root(root_rank, "hvd.broadcast_object")
    collectives = backend()
    name = collective_name("broadcast_object", name)
    mine = collectives.rank == root_rank
    payload = _to_bytes(obj) if mine else None
    length = collectives.broadcast([tf.constant([0 if payload is None else payload.shape[0]], tf.int64)], root_rank, f"{name}_length")[0]
    count = int(_value(length, session)[0])  # run on every rank: in a graph, the root's too
    data = tf.constant(payload) if mine else tf.zeros([count], tf.uint8)
    data = _value(collectives.broadcast([data], root_rank, name)[0], session)
    return obj if mine else _from_bytes(data)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None, process_set: Any = global_process_set) -> Callable[[Any], Any]:
    """`broadcast_object` with these arguments, as a function of the object."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    session = _session("hvd.allgather_object", session, process_set)
    gathered, sizes = _value(gather_ragged(tf.constant(_to_bytes(obj)), collective_name("allgather_object", name)), session)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [_from_bytes(gathered[start:stop]) for start, stop in zip(offsets[:-1], offsets[1:])]


def _session(feature: str, session: Any, process_set: Any) -> Any:
    """The TensorFlow 1 session that runs an object's collectives in a graph (None eagerly)."""
    check_process_set(process_set, feature)
    if tf.executing_eagerly():
        return None
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        refuse(f"{feature} inside a tf.function", "Python objects travel eagerly; call it outside the function")
    return session


def _value(tensors: Any, session: Any) -> Any:
    """The tensors' values: eagerly, or run in the graph's session."""
    return tf.nest.map_structure(lambda tensor: tensor.numpy(), tensors) if session is None else session.run(tensors)


def _to_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(_pickler.dumps(obj), dtype=np.uint8)


def _from_bytes(data: np.ndarray) -> Any:
    return _pickler.loads(data.tobytes())
