"""Horovod's keyword options of DistributedGradientTape and DistributedOptimizer, defined once:
their names and defaults (`HorovodOptions`' fields), what Caramel refuses of them (`checked`), and
Horovod's signatures over them (`horovod_signature`).

Caramel's drop-ins (`caramel.tensorflow`) take the options by keyword; Horovod's API as Caramel
serves it (`caramel.compat`) declares each Horovod function's own order of them with
`horovod_signature`, so that both take the same options with the same defaults.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from caramel.collectives.backend import ReduceOp
from caramel.tensorflow.compression import Compression, Compressor
from caramel.tensorflow.unsupported import refuse

Result = TypeVar("Result")


@dataclass(frozen=True)
class HorovodOptions:
    """Horovod's keywords of DistributedGradientTape and DistributedOptimizer, with Horovod's
    defaults (but `process_set`: None is Horovod's global process set)."""

    # Where Horovod places its collectives' inputs on GPUs; the backend places them.
    device_dense: str = ""
    device_sparse: str = ""
    compression: type[Compressor] = Compression.none
    # Caramel reduces (and accumulates) every gradient as a dense tensor anyway.
    sparse_as_dense: bool = False
    op: Any = ReduceOp.AVERAGE
    gradient_predivide_factor: float = 1.0
    # Horovod's fusion hints; Caramel plans the grouping of the transfers itself.
    num_groups: int = 0
    groups: Any = None
    process_set: Any = None
    scale_local_gradients: bool = True
    """Whether a local source's gradient is divided by the number of ranks, as Horovod does."""
    backward_passes_per_step: int = 1
    """Backward passes per update (Horovod's local gradient accumulation: accumulation.py)."""
    average_aggregated_gradients: bool = False
    # The name of Horovod's optimizer (its TF1 scopes); Keras names the optimizer.
    name: str | None = None

    @classmethod
    def checked(cls, kind: str, **horovod_options: Any) -> HorovodOptions:
        """The options given to `kind` (DistributedGradientTape or DistributedOptimizer), `op` as
        Caramel's Average or Sum; what Caramel does not do is refused by name."""
        options = cls(**horovod_options)
        if options.gradient_predivide_factor != 1.0:
            refuse(f"{kind}(gradient_predivide_factor={options.gradient_predivide_factor})", "use 1.0")
        passes = options.backward_passes_per_step
        if passes != 1 and kind == "DistributedGradientTape":
            refuse(
                f"DistributedGradientTape(backward_passes_per_step={passes})",
                "Horovod's tape has no local gradient accumulation; give backward_passes_per_step to DistributedOptimizer",
            )
        if passes < 1:
            raise ValueError(f"{kind}(backward_passes_per_step={passes}): it must be at least 1")
        if options.process_set is not None and getattr(options.process_set, "process_set_id", 0) != 0:
            refuse(f"{kind}(process_set=...)", "gradients are averaged over all ranks")
        return replace(options, op=_reduce_op(options.op, kind))


def _reduce_op(op: Any, kind: str) -> ReduceOp:
    """Caramel's Average and Sum, or Horovod's (its op constants are small integers, or names)."""
    if isinstance(op, ReduceOp) and op in (ReduceOp.AVERAGE, ReduceOp.SUM):
        return op
    name = getattr(op, "name", None) or {0: "average", 1: "sum", 2: "adasum", 3: "min", 4: "max", 5: "product"}.get(op, str(op))
    if str(name).lower() in ("average", "sum"):
        return ReduceOp(str(name).lower())
    refuse(f"{kind}(op={name})", "gradients are averaged (Average) or summed (Sum)")


def horovod_signature(first: str, *names: str, **defaults: Any) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Give a function one of Horovod's signatures: `first` (the tape or the optimizer), then
    `names` in Horovod's order of that function, each with HorovodOptions' default, or with one of
    `defaults` (Horovod's own where it differs, or a parameter that is not an option:
    `use_locking`, `local_layers`). Horovod's functions take their parameters by position too; the
    decorated function receives them all by name."""
    option_defaults = {field.name: field.default for field in fields(HorovodOptions)}
    parameters = [inspect.Parameter(first, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[name] if name in defaults else option_defaults[name])
        for name in names
    ]
    signature = inspect.Signature(parameters)

    def declare(function: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(function)
        def with_horovods_parameters(*args: Any, **kwargs: Any) -> Result:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{function.__name__}() {error}") from None
            bound.apply_defaults()
            return function(**bound.arguments)

        with_horovods_parameters.__signature__ = signature  # type: ignore[attr-defined]  # what inspect.signature reports
        return with_horovods_parameters

    return declare


__all__ = ["HorovodOptions", "horovod_signature"]
