"""A training process for tests/tensorflow/test_retrace.py: how many times `ctf.function` traces the step
of its graphs. Prints, for each graph the step was traced into, how many times it was traced
there (Caramel's graph of several steps traces the step once and copies its graph, `unrolled.py`).
With --say-total-steps, `ctf.function` is told the run takes 400 steps: too few to repay a graph
of several steps of this small model, whose plan is at most a few ms a step faster than the
backend's own way (and no faster on one rank, which sends nothing).

A variable made while tf.function traces makes it trace the whole function a second time; the
stamps' variables once were, so every new plan traced its multi-step graph twice (four unrolled
steps of an emulated ResNet-50, 4 workers on 2 cores: the adopting execution took 75 s, now 49 s).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import tensorflow as tf

from testbed.small_steps import train_past_the_first_plan

STEPS_PER_EXECUTION = 4
SAID_TOTAL_STEPS = 400


def main() -> None:
    steps_per_graph: Counter[tf.Graph] = Counter()

    def count_trace() -> None:
        steps_per_graph[tf.compat.v1.get_default_graph()] += 1

    total = SAID_TOTAL_STEPS if "--say-total-steps" in sys.argv[1:] else None
    train_past_the_first_plan(STEPS_PER_EXECUTION, on_trace=count_trace, total_steps=total)
    print(json.dumps({"steps_per_traced_graph": sorted(steps_per_graph.values())}), flush=True)


if __name__ == "__main__":
    main()
