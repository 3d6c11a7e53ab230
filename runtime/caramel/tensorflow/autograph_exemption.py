"""Caramel's own code is called as it is written inside a script's tf.function, not rewritten by AutoGraph.

A `tf.function` hands the script's step to AutoGraph, which rewrites every Python function the
step calls, and every function those call, so that Python's `if` and `for` on tensors become graph
control flow. Caramel's tape, optimizer, Horovod-shaped collectives, planner and step graph build
their ops explicitly (`tf.cond`, `tf.switch_case`) and need none of that, but AutoGraph parses and
rewrites them all the same, once per process: most of a small model's tracing time
(`benchmarks/results/2026-11-29-autograph-exemption.txt`), paid by every rank at every start and
every restart. TensorFlow exempts its own packages, NumPy and Keras the same way (AutoGraph's
conversion rules); Caramel's packages join them. The script's own functions are still converted,
as is the function a `tf.function` is given, whoever wrote it (AutoGraph converts what it was
asked to convert). Code that Caramel calls back (a loss function handed to `minimize`) runs as
written, as it does when Keras calls it.

The rules are a tuple in TensorFlow's AutoGraph configuration, which has no public setter;
`tf.autograph.experimental.do_not_convert` would exempt functions one by one, and miss the next
one written. Where a TensorFlow release moved the tuple, nothing is exempted and Caramel traces as
before, only slower (tests/tensorflow/test_autograph_exemption.py says so).
"""

from __future__ import annotations

# The packages whose functions AutoGraph leaves as they are: Caramel's, and the `horovod` package
# Caramel serves to scripts written for Horovod (caramel.compat), which reaches into the real
# Horovod's ops.
EXEMPT_PACKAGES = ("caramel", "horovod")


def exempt_caramel_from_autograph() -> bool:
    """Add Caramel's packages to AutoGraph's exemptions (once); False where TensorFlow has no such rules."""
    try:
        from tensorflow.python.autograph.core import config, config_lib
    except ImportError:
        return False
    rules = getattr(config, "CONVERSION_RULES", None)
    if not isinstance(rules, tuple):
        return False
    exempted = [rule for rule in rules if isinstance(rule, config_lib.DoNotConvert)]
    missing = tuple(
        config_lib.DoNotConvert(package) for package in EXEMPT_PACKAGES if not any(rule.matches(package) for rule in exempted)
    )
    # First in the tuple: AutoGraph stops at the first rule that matches.
    config.CONVERSION_RULES = (*missing, *rules)
    return True
