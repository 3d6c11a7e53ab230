"""What Caramel's `horovod` package shares: the error for the Horovod features it does not serve
(Caramel's own, `caramel.tensorflow.unsupported`), and stand-ins that raise it when called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from caramel.tensorflow.unsupported import NotSupportedByCaramel, refuse


def unsupported(feature: str, advice: str) -> Callable[..., NoReturn]:
    """A stand-in for a Horovod function or class that fails when called, not when looked up, so
    that a script may still test for it (`hasattr`, imports) and fails only where it uses it."""

    def stand_in(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(feature, advice)

    stand_in.__name__ = stand_in.__qualname__ = feature.rsplit(".", 1)[-1]
    stand_in.__doc__ = f"Not supported by Caramel: {advice}"
    return stand_in


def unsupported_module(module_name: str, feature: str, advice: str) -> Callable[[str], Any]:
    """A module-level `__getattr__` for a Horovod module Caramel does not serve (elastic training):
    every name looked up in it is a stand-in that fails when called."""

    def module_getattr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return unsupported(f"{feature}.{name}", advice)

    return module_getattr


__all__ = ["NotSupportedByCaramel", "refuse", "unsupported", "unsupported_module"]
