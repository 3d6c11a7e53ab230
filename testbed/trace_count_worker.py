"""A training process for tests/test_retrace.py: how many times `ctf.function` traces the step
of its graph of several steps. Prints, for each graph the step was traced into, how many times
it was traced there (the step is traced once and its graph copied, `unrolled.py`). With
--say-total-steps, `ctf.function` knows the run's 12 steps: too few to repay a graph of several.

A variable made while tf.function traces makes it trace the whole function a second time; the
stamps' variables once were, so every new plan traced its multi-step graph twice (four unrolled
steps of an emulated ResNet-50, 4 workers on 2 cores: the adopting execution took 75 s, now 49 s).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import tensorflow as tf

import caramel.tensorflow as ctf
from testbed.small_steps import train

STEPS_PER_EXECUTION = 4
EXECUTIONS = 3  # the first runs its steps one by one; the first measured plan comes in with the second


def main() -> None:
    ctf.init()
    steps_per_graph: Counter[tf.Graph] = Counter()

    def count_trace() -> None:
        steps_per_graph[tf.compat.v1.get_default_graph()] += 1

    train(EXECUTIONS, STEPS_PER_EXECUTION, on_trace=count_trace, say_total_steps="--say-total-steps" in sys.argv[1:])
    print(json.dumps({"steps_per_traced_graph": sorted(steps_per_graph.values())}), flush=True)


if __name__ == "__main__":
    main()
