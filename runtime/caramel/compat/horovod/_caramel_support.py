"""What Caramel's `horovod` package shares: the error for the Horovod features it does not serve
(Caramel's own, `caramel.tensorflow.unsupported`), and stand-ins that raise it when called."""

from __future__ import annotations

from typing import Any, NoReturn

from caramel.tensorflow.unsupported import NotSupportedByCaramel, refuse


def unsupported(feature: str, advice: str) -> Any:
    """A stand-in for a Horovod function or class that fails when used, not when looked up, so that
    a script may still test for it (`hasattr`, imports) and fails only where it uses it, naming it.
    A class's stand-in (a capitalized name) fails when made or subclassed (`class
    State(hvd.ProcessSet)`); an exception's can still be named in an `except` clause."""
    name = feature.rsplit(".", 1)[-1]
    doc = f"Not supported by Caramel: {advice}"

    def stand_in(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(feature, advice)

    if not name[:1].isupper():
        stand_in.__name__ = stand_in.__qualname__ = name
        stand_in.__doc__ = doc
        return stand_in

    def refused_subclass(cls: type, **kwargs: Any) -> NoReturn:
        refuse(feature, advice)

    base = Exception if name.endswith(("Error", "Exception", "Interrupt")) else object
    return type(name, (base,), {"__new__": stand_in, "__init_subclass__": classmethod(refused_subclass), "__doc__": doc})


__all__ = ["NotSupportedByCaramel", "refuse", "unsupported"]
