"""Keras 2 idioms of Horovod-era scripts that Keras 3 refuses, accepted again for the scripts that
use Caramel's `horovod` package, and only for them: `install()` runs at `hvd.init()` and when
`horovod.tensorflow.keras` is imported, never when Caramel's own API is used.

Horovod's examples and most scripts written for it target Keras 2 (tf.keras up to TensorFlow 2.15).
Under TensorFlow 2.16+ tf.keras is Keras 3 (unless a job asks for Keras 2 with
TF_USE_LEGACY_KERAS=1, where there is nothing to accept: `caramel.tensorflow.keras_version`),
which breaks these lines of theirs:

- `model.compile(..., experimental_run_tf_function=False)`: Horovod asked Keras 2 for this so that
  its DistributedOptimizer computed the gradients. Keras 3's compile takes no such keyword
  (TypeError); its training step always applies gradients through the optimizer, which is where
  Caramel's DistributedOptimizer averages them. The keyword is accepted and ignored; any other
  unknown keyword still fails as Keras 3 makes it.
- `opt.variables()`: Keras 2 optimizers had a `variables()` method (Horovod's examples broadcast
  `opt.variables()` after the first step); a Keras 3 optimizer's `variables` is a list property
  ("'list' object is not callable"). The list it returns is made callable, returning itself, so
  both `opt.variables` and `opt.variables()` work.

Each patch is made once and marked, so installing twice changes nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from caramel.tensorflow.keras_version import keras_2

MARK = "_caramel_keras2_idiom"


class CallableList(list):
    """A list that returns itself when called: Keras 2's `optimizer.variables()` on Keras 3's
    `optimizer.variables` property."""

    def __call__(self) -> CallableList:
        return self


def install() -> None:
    """Accept the Keras 2 idioms above on Keras 3 (idempotent)."""
    if keras_2():
        return
    _accept_experimental_run_tf_function()
    _callable_optimizer_variables()


def _accept_experimental_run_tf_function() -> None:
    # Patched where it is defined (Keras' Trainer), not on Model: Keras loads a saved model
    # without compiling it when the model's class has a compile of its own.
    owner = next(cls for cls in tf.keras.Model.__mro__ if "compile" in cls.__dict__)
    original = owner.compile
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def compile(self: tf.keras.Model, *args: Any, experimental_run_tf_function: Any = None, **kwargs: Any) -> Any:  # noqa: A001
        del experimental_run_tf_function  # Keras 2's; Keras 3 always applies gradients through the optimizer
        return original(self, *args, **kwargs)

    setattr(compile, MARK, True)
    owner.compile = compile


def _callable_optimizer_variables() -> None:
    """Every optimizer class that defines the `variables` property (Keras' base optimizer, and the
    wrappers that override it) returns a CallableList; subclasses made later inherit it."""
    root = next(cls for cls in tf.keras.optimizers.Optimizer.__mro__ if isinstance(cls.__dict__.get("variables"), property))
    pending, seen = [root], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        prop = cls.__dict__.get("variables")
        if isinstance(prop, property) and not getattr(prop.fget, MARK, False):
            cls.variables = property(_callable(prop.fget), prop.fset, prop.fdel, prop.__doc__)


def _callable(getter: Any) -> Any:
    @functools.wraps(getter)
    def variables(self: Any) -> CallableList:
        return CallableList(getter(self))

    setattr(variables, MARK, True)
    return variables
