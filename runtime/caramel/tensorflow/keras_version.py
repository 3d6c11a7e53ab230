"""Which Keras `tf.keras` is in this process, and the few things Caramel does differently on each.

TensorFlow 2.21's `tf.keras` is Keras 3, unless the environment sets TF_USE_LEGACY_KERAS=1 and
tf-keras (Keras 2.21) is installed: then it is Keras 2, which Horovod-era scripts were written
for, and which runs them faster than Keras 3 does (README, Results). A job chooses with
`spec.env`; Caramel follows whichever `tf.keras` is: its Keras callback and the Keras classes of
the Horovod API it serves derive from `tf.keras`'s, and its DistributedOptimizer averages the
gradients where that Keras applies them (`updating_through`). `import keras` is Keras 3 either
way (TensorFlow's own rule), so Caramel's code reaches Keras through `tf.keras` only. Keras 2's
legacy optimizers (`tf.keras.optimizers.legacy.*`, which Keras 3 has not) are wrapped as its
others, through their own methods (`optimizer_state`, `updating_through`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from caramel.tensorflow.unsupported import refuse

Update = Callable[[Any, list[Any], Sequence[Any], Callable[[list[Any]], Any]], Any]
"""An optimizer's update: (optimizer, gradients, variables, apply) -> what the update returns,
`apply(gradients)` applying gradients to the variables as the optimizer's own class does."""
Prepare = Callable[[Any, list[Any], Sequence[Any]], list[Any]]
"""What Keras 2's `compute_gradients` does to the gradients it returns: (optimizer, gradients, variables) -> gradients."""
Build = Callable[[Any, Sequence[Any]], None]
"""What building an optimizer's state for variables makes besides: (optimizer, variables) -> None."""


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


def _legacy(optimizer_class: type[Any]) -> bool:
    """Whether `optimizer_class` is one of Keras 2's legacy optimizers (tf.keras.optimizers.legacy.*)."""
    return keras_2() and issubclass(optimizer_class, tf.keras.optimizers.legacy.Optimizer)


def check_optimizer(optimizer: Any, feature: str) -> None:
    """Refuse what Caramel's DistributedOptimizer cannot wrap, naming it: anything but a Keras
    optimizer of the Keras `tf.keras` is (Keras 2's legacy optimizers included)."""
    if isinstance(optimizer, tf.keras.optimizers.Optimizer) or _legacy(type(optimizer)):
        return
    kind = type(optimizer).__name__
    if "legacy" in type(optimizer).__module__ or "optimizer_v2" in type(optimizer).__module__:
        refuse(
            f"{feature}(a legacy {kind})",
            f"tf.keras is Keras 3 here, which has no legacy optimizers: use tf.keras.optimizers.{kind}, or set "
            "TF_USE_LEGACY_KERAS=1 in the job's spec.env for Keras 2 (tf-keras), which has them",
        )
    refuse(f"{feature}({kind})", "it wraps Keras optimizers (tf.keras.optimizers.*); TensorFlow 1 optimizers are gone")


def optimizer_state(optimizer: Any, variables: Sequence[Any]) -> list[Any]:
    """`optimizer`'s variables (slots, step count, hyperparameters), made first for `variables`
    where they are not yet: to be restored or broadcast, they must exist. Keras 2's legacy
    optimizers make them in `_create_all_weights` and list them with a method."""
    if _legacy(type(optimizer)):
        optimizer._create_all_weights(list(variables))
        return list(optimizer.variables())
    optimizer.build(list(variables))
    return list(optimizer.variables)


def updating_through(base: type[Any], update: Update, *, prepare: Prepare | None = None, build: Build | None = None, **attributes: Any) -> type[Any]:
    """A subclass of Keras optimizer class `base` (with `attributes`) whose updates are `update`:
    Keras 3's `apply` (which `apply_gradients` and a Keras model's training step call), Keras 2's
    `apply_gradients` (which its `minimize` calls). Where given, Keras 2's `compute_gradients` (and
    `_compute_gradients`, which Horovod's tests and Keras 2's legacy `minimize` call) return their
    gradients through `prepare`, and building the optimizer's state (`build`; a legacy
    optimizer's `_create_all_weights`) also runs `build`.

    Both Kerases sum the gradients over a tf.distribute strategy's replicas before they apply them.
    Without a strategy (a Caramel job) that sum is an identity, but it joins all the gradients into
    one IdentityN (tf.custom_gradient's forward pass), so no parameter is updated before the
    step's last transfer ends, and on Keras 3 it registers a gradient function globally on every
    trace (every traced step graph then lives as long as the process). So it is skipped: Keras 3
    applies the gradients in a merge_call (cross-replica context), where it takes them as they
    are, and Keras 2 is told to skip its aggregation (each of its optimizer kinds by its own keyword)."""
    methods: dict[str, Callable[..., Any]] = _keras_2_methods(base, update, prepare) if keras_2() else _keras_3_methods(base, update)
    if build is not None:
        builder = "_create_all_weights" if _legacy(base) else "build"

        def building(self: Any, var_list: Any, *args: Any, **kwargs: Any) -> Any:
            built = getattr(base, builder)(self, var_list, *args, **kwargs)
            build(self, list(var_list))
            return built

        methods[builder] = building
    # Named as the class it derives from, so that a model saved with it loads with that one.
    return type(base.__name__, (base,), {**methods, "__module__": base.__module__, **attributes})


_AGGREGATION_KEYWORDS = ("skip_gradients_aggregation", "experimental_aggregate_gradients")
"""Keras 2's keywords for whether apply_gradients sums over the replicas (its optimizers', its legacy ones')."""


def _keras_2_methods(base: type[Any], update: Update, prepare: Prepare | None) -> dict[str, Callable[..., Any]]:
    skip = {"experimental_aggregate_gradients": False} if _legacy(base) else {"skip_gradients_aggregation": True}

    def apply_gradients(self: Any, grads_and_vars: Any, name: str | None = None, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        variables = [variable for _, variable in pairs]
        options = {key: value for key, value in kwargs.items() if key not in _AGGREGATION_KEYWORDS}

        def apply(gradients: list[Any]) -> Any:
            return base.apply_gradients(self, list(zip(gradients, variables)), name=name, **skip, **options)

        return update(self, [gradient for gradient, _ in pairs], variables, apply)

    methods: dict[str, Callable[..., Any]] = {"apply_gradients": apply_gradients}
    if prepare is not None:

        def _compute_gradients(self: Any, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None) -> list[tuple[Any, Any]]:
            if _legacy(base):
                pairs = list(base._compute_gradients(self, loss, var_list, grad_loss=grad_loss, tape=tape))
            else:
                pairs = list(base.compute_gradients(self, loss, var_list, tape=tape))
            variables = [variable for _, variable in pairs]
            return list(zip(prepare(self, [gradient for gradient, _ in pairs], variables), variables))

        def compute_gradients(self: Any, loss: Any, var_list: Any, tape: Any = None) -> list[tuple[Any, Any]]:
            return _compute_gradients(self, loss, var_list, tape=tape)

        methods.update(_compute_gradients=_compute_gradients, compute_gradients=compute_gradients)
    return methods


def _keras_3_methods(base: type[Any], update: Update) -> dict[str, Callable[..., Any]]:
    def apply(self: Any, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        variables = trainable_variables if trainable_variables is not None else getattr(self, "_trainable_variables", [])

        def applied(gradients: list[Any]) -> Any:
            context = tf.distribute.get_replica_context()
            if context is None:
                return base.apply(self, gradients, trainable_variables)
            return context.merge_call(lambda _: base.apply(self, gradients, trainable_variables))

        return update(self, list(grads), variables, applied)

    return {"apply": apply}


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
