"""The end-of-run weights check for scripts written for Horovod's API.

Caramel's own entry points check at the end of training that every rank holds the same trainable
weights (`TrainingRun`, and the Keras callback that `hvd.callbacks.BroadcastGlobalVariablesCallback`
is). A script written for Horovod trains in its own loop and has no end Caramel could see, so the
variables it trains through Caramel are noted as they pass (the sources of
`hvd.DistributedGradientTape`'s gradients, the variables `hvd.DistributedOptimizer` updates, the
trainable variables given to `hvd.broadcast_variables`) and checked when the process exits, or at
`hvd.shutdown()`: every rank prints `caramel: weights digest ...` (the digest Caramel's own runs
print) and, if two ranks disagree, the process fails with exit status 1.

No check runs after an uncaught exception (the other ranks may never come to it: the failure is
what the job reports), nor when the last thing trained was a Keras `fit` whose Caramel callback
checked at its end.
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from caramel.tensorflow.ledger import weights_digest
from caramel.tensorflow.runtime import Runtime, current

EXIT_WEIGHTS_DIFFER = 1


@dataclass
class _State:
    armed: bool = False
    failed: bool = False
    """An exception went uncaught: the process is failing, no check."""
    done: bool = False
    checked: bool = False
    """The weights were checked (by Caramel's Keras callback) after the last training noted."""
    trained: dict[int, Any] = field(default_factory=dict)
    """The variables trained through Caramel, by id, in the order first seen (the same on every rank)."""


_state = _State()


def note_trained(variables: Any) -> None:
    """Variables that training through Caramel updates (trace time or eager)."""
    for variable in tf.nest.flatten(variables):
        if hasattr(variable, "assign") and getattr(variable, "trainable", True):
            _state.trained.setdefault(id(variable), variable)
    _state.checked = False


def checked_by_fit() -> None:
    """Caramel's Keras callback checked every rank's weights at the end of `fit`."""
    _state.checked = True


def arm() -> None:
    """Check at exit (once per process; after the runtime is set up, so that the check runs before
    the backend's own exit handlers)."""
    if _state.armed:
        return
    _state.armed = True
    previous = sys.excepthook

    def note_failure(kind: type[BaseException], error: BaseException, traceback: Any) -> None:
        _state.failed = True
        previous(kind, error, traceback)

    sys.excepthook = note_failure
    atexit.register(check)


def rearm() -> None:
    """Check at exit before the backend's exit handlers again, after it registered them anew (an
    elastic gang's ranks re-formed: Horovod's `init` registers its shutdown at exit each time)."""
    if _state.armed:
        atexit.unregister(check)
        atexit.register(check)


def check() -> None:
    """Every rank's digest of the variables noted; exits with status 1 if the ranks disagree. Every
    rank must call it (it is a collective), and does: at exit or at `hvd.shutdown()`."""
    if not _state.armed or _state.failed or _state.done:
        return
    _state.done = True
    if _state.checked:
        return
    try:
        runtime = current()
    except RuntimeError:
        return
    _check(runtime, list(_state.trained.values()))


def _check(runtime: Runtime, variables: list[Any]) -> None:
    digest = weights_digest(variables, leaving_out=runtime.local_variables)
    if variables:
        print(f"caramel: weights digest {digest}", file=sys.stderr, flush=True)
    prefix = np.frombuffer(bytes.fromhex(digest[:16]), dtype=np.int64)
    every_rank = runtime.backend.all_gather(tf.constant(prefix), name="caramel_final_weights_digest").numpy().reshape(-1).tolist()
    if len(set(every_rank)) != 1:
        print(f"caramel: ranks finished with different weights: digest prefixes {every_rank}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_WEIGHTS_DIFFER)  # an exception in an exit handler would not change the exit status
