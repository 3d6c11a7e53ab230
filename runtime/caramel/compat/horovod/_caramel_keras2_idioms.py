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
- `tf.keras.layers.BatchNormalization(..., fused=False)`: Keras 2 let a script choose its fused
  kernel; Keras 3 chooses itself and refuses the keyword (ValueError). It is accepted and ignored.
- `variable.ref()`: a tf.Variable's hashable reference, which Keras 2's weights were (scripts key
  dicts of gradients by it, as Horovod's own tests do); a Keras 3 variable has no `ref`. It gets
  the same: TensorFlow's reference by identity to the variable, whose `deref()` is the variable.

Each patch is made once and marked, so installing twice changes nothing.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import tensorflow as tf
from tensorflow.python.util import object_identity  # what tf.Variable.ref() returns

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
    _accept_fused_batch_normalization()
    _variable_refs()


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


def _accept_fused_batch_normalization() -> None:
    layer = tf.keras.layers.BatchNormalization
    original = layer.__init__
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, fused: Any = None, **kwargs: Any) -> None:  # noqa: N807
        del fused  # Keras 2's choice of kernel; Keras 3 makes its own
        original(self, *args, **kwargs)

    # Keras reads a layer's arguments off its __init__'s signature (its config): the original's.
    __init__.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    setattr(__init__, MARK, True)
    layer.__init__ = __init__


def _variable_refs() -> None:
    variable = tf.keras.Variable
    if hasattr(variable, "ref"):
        return

    def ref(self: Any) -> object_identity.Reference:
        """A hashable reference to this variable (Keras 2's, tf.Variable's `ref()`)."""
        return object_identity.Reference(self)

    variable.ref = ref


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
