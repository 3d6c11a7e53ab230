"""How long the graph measures Horovod's own way against the plan: the arithmetic of a round of
the arm selector (`caramel.tensorflow.selector`), and of the round between Caramel's graph and
Horovod's own that follows it (`caramel.tensorflow.graph_choice`), which benchmarks need without
TensorFlow.

A round settles for some steps, then runs blocks of each arm in turn, BLOCK_PAIRS of each, and
decides. A block is whole executions, so that each arm's measured steps carry as many execution
boundaries, and at least MIN_BLOCK_STEPS steps, so that each block has a few measured steps (its
first is not measured).
"""

from __future__ import annotations

import math

BLOCK_PAIRS = 2
MIN_BLOCK_STEPS = 4


def block_steps(steps_per_execution: int) -> int:
    """Steps of one block: whole executions, at least MIN_BLOCK_STEPS."""
    return steps_per_execution * math.ceil(MIN_BLOCK_STEPS / steps_per_execution)


def explore_steps(steps_per_execution: int) -> int:
    """Steps of a round's blocks, both arms."""
    return 2 * BLOCK_PAIRS * block_steps(steps_per_execution)


def settled_step(steps_per_execution: int) -> int:
    """The last step before a `caramel.tensorflow.function` runs what its first rounds chose:
    the arm its first measured plan's round chose (`first_decision_step`), then the graph, after
    a round of blocks of Caramel's graph and Horovod's own (`caramel.tensorflow.graph_choice`),
    as long as the selector's."""
    return first_decision_step(steps_per_execution) + explore_steps(steps_per_execution)


def first_decision_step(steps_per_execution: int) -> int:
    """The last step before a `caramel.tensorflow.function` runs the arm its first measured plan's
    round chose, where the steps wait for the first plan's search (the planning
    policy's `first_plan_waits`, which the benchmarks' steady-state runs and the tests set): its first
    execution runs the backend's own graph and stamps the gradients' releases, the first plan is
    decided at its end, the plan's first execution (a new graph) settles, and its blocks follow.
    Where the search runs beside the steps (every job), all of it comes as many executions later
    as the search takes."""
    return 2 * steps_per_execution + explore_steps(steps_per_execution)
