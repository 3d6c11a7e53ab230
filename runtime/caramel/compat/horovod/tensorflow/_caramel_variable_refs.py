"""Horovod's `vars_to_refs` and `refs_to_vars` (`horovod.tensorflow.util`), which key variables in
dicts and sets: a variable's `ref()` where it has one (tf.Variable), and for a Keras 3 variable,
which has none (horovod#4290), a reference of the same kind, by identity."""

from __future__ import annotations

from typing import Any


class VariableRef:
    """A hashable reference to a variable, by identity; `deref()` gives the variable back."""

    def __init__(self, variable: Any) -> None:
        self._variable = variable

    def deref(self) -> Any:
        return self._variable

    def __hash__(self) -> int:
        return id(self._variable)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VariableRef) and other._variable is self._variable


def vars_to_refs(vars: Any) -> Any:  # noqa: A002 (Horovod's parameter name)
    """A variable's reference, or a tuple of the references of a list of them (nested as given)."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(variable) for variable in vars)
    return vars.ref() if hasattr(vars, "ref") else VariableRef(vars)


def refs_to_vars(refs: Any) -> Any:
    """The variables of `vars_to_refs`' references, a tuple of them as a list."""
    if isinstance(refs, tuple):
        return [refs_to_vars(ref) for ref in refs]
    return refs.deref()
