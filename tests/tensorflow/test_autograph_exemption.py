"""AutoGraph leaves Caramel's code as it is written and still converts the script's own
(caramel.tensorflow.autograph_exemption): the exemption is what AutoGraph itself consults before it
rewrites a function that a traced step calls."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.autograph.core import config
from tensorflow.python.autograph.impl import conversion

import caramel.tensorflow as ctf
from caramel.planner.schedule import build_schedule
from caramel.tensorflow.autograph_exemption import EXEMPT_PACKAGES, exempt_caramel_from_autograph
from caramel.tensorflow.communicator import GradientCommunicator


def a_scripts_step(x):
    if x > 0:  # a Python `if` on a tensor: only AutoGraph makes it graph control flow
        return x
    return -x


def test_caramels_functions_are_exempt_and_a_scripts_are_not():
    # Importing caramel.tensorflow (above) exempted its packages: TensorFlow has the rules still.
    assert exempt_caramel_from_autograph(), "TensorFlow's AutoGraph rules moved: Caramel's code is converted again"
    assert conversion.is_allowlisted(build_schedule)  # caramel.planner, called while a step is traced
    assert conversion.is_allowlisted(GradientCommunicator.allreduce)
    assert conversion.is_allowlisted(ctf.DistributedGradientTape)
    assert not conversion.is_allowlisted(a_scripts_step)
    # Called from a traced function, as a script's step calls its helpers: converted, or its `if` would fail.
    assert float(tf.function(lambda x: a_scripts_step(x) * 1.0)(tf.constant(-2.0))) == 2.0


def test_the_exemption_is_added_once():
    exempt_caramel_from_autograph()
    exempt_caramel_from_autograph()
    prefixes = [str(rule) for rule in config.CONVERSION_RULES]
    for package in EXEMPT_PACKAGES:
        assert prefixes.count(f"DoNotConvert rule for {package}") == 1, prefixes
