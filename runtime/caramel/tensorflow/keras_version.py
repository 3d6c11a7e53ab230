"""Which Keras `tf.keras` is in this process, and the few things Caramel does differently on each.

TensorFlow 2.21's `tf.keras` is Keras 3, unless the environment sets TF_USE_LEGACY_KERAS=1 and
tf-keras (Keras 2.21) is installed: then it is Keras 2, which Horovod-era scripts were written
for, and which runs them faster than Keras 3 does (README, Results). A job chooses with
`spec.env`; Caramel follows whichever `tf.keras` is: its Keras callback and the Keras classes of
the Horovod API it serves derive from `tf.keras`'s, and its DistributedOptimizer averages the
gradients where that Keras applies them (`updating_through`). `import keras` is Keras 3 either
way (TensorFlow's own rule), so Caramel's code reaches Keras through `tf.keras` only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from caramel.tensorflow.unsupported import refuse

Transform = Callable[[Any, list[Any], Sequence[Any]], list[Any]]
"""What an optimizer's update does to its gradients first: (optimizer, gradients, variables) -> gradients."""


@functools.cache
def keras_2() -> bool:
    """Whether `tf.keras` is Keras 2 (tf-keras) in this process."""
    try:
        model_module = tf.keras.Model.__module__
    except ImportError as error:  # TensorFlow's own message says no more than "Keras cannot be imported"
        raise RuntimeError(
            "TF_USE_LEGACY_KERAS asks for Keras 2 (tf-keras), which is not installed here: `make setup` installs it and the "
            "runtime image carries it; or unset TF_USE_LEGACY_KERAS for Keras 3"
        ) from error
    return model_module.startswith("tf_keras")


def check_optimizer(optimizer: Any, feature: str) -> None:
    """Refuse what Caramel's DistributedOptimizer cannot wrap, naming it: anything but a Keras
    optimizer of the Keras `tf.keras` is (Keras 2's legacy optimizers included)."""
    if isinstance(optimizer, tf.keras.optimizers.Optimizer):
        return
    kind = type(optimizer).__name__
    if keras_2() and isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        refuse(f"{feature}(tf.keras.optimizers.legacy.{kind})", f"use tf.keras.optimizers.{kind}")
    refuse(f"{feature}({kind})", "it wraps Keras optimizers (tf.keras.optimizers.*); TensorFlow 1 optimizers are gone")


def updating_through(base: type[Any], transform: Transform, **attributes: Any) -> type[Any]:
    """A subclass of Keras optimizer class `base` (with `attributes`) whose updates pass their
    gradients through `transform` first: Keras 3's `apply` (which `apply_gradients` and a Keras
    model's training step call), Keras 2's `apply_gradients` (which its `minimize` calls).

    Both Kerases sum the gradients over a tf.distribute strategy's replicas before they apply them.
    Without a strategy (a Caramel job) that sum is an identity, but it joins all the gradients into
    one IdentityN (tf.custom_gradient's forward pass), so no parameter is updated before the
    step's last transfer ends, and on Keras 3 it registers a gradient function globally on every
    trace (every traced step graph then lives as long as the process). So it is skipped: Keras 3
    applies the gradients in a merge_call (cross-replica context), where it takes them as they
    are, and Keras 2 is told to skip its aggregation."""

    if keras_2():

        def apply_gradients(self: Any, grads_and_vars: Any, name: str | None = None, skip_gradients_aggregation: bool = False, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            variables = [variable for _, variable in pairs]
            gradients = transform(self, [gradient for gradient, _ in pairs], variables)
            return base.apply_gradients(self, list(zip(gradients, variables)), name=name, skip_gradients_aggregation=True, **kwargs)

        update: dict[str, Callable[..., Any]] = {"apply_gradients": apply_gradients}
    else:

        def apply(self: Any, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
            variables = trainable_variables if trainable_variables is not None else getattr(self, "_trainable_variables", [])
            gradients = transform(self, list(grads), variables)
            context = tf.distribute.get_replica_context()
            if context is None:
                return base.apply(self, gradients, trainable_variables)
            return context.merge_call(lambda _: base.apply(self, gradients, trainable_variables))

        update = {"apply": apply}
    # Named as the class it derives from, so that a model saved with it loads with that one.
    return type(base.__name__, (base,), {**update, "__module__": base.__module__, **attributes})


@contextmanager
def running_steps_per_execution(model: Any, steps: int) -> Iterator[None]:
    """The model's steps per execution set to `steps` for a while (a fit's), then as compiled
    again (both Kerases take them through the same property)."""
    compiled = steps_per_execution(model)
    model.steps_per_execution = steps
    try:
        yield
    finally:
        model.steps_per_execution = compiled


def steps_per_execution(model: Any) -> int:
    """The steps per execution `compile` gave the model (Keras 2 keeps them in a variable, which
    `fit` lowers for an epoch's last execution)."""
    steps = model.steps_per_execution
    return int(steps.numpy()) if isinstance(steps, tf.Variable) else int(steps)
