"""Caramel's graph of several steps against the backend's own per-step graph, measured between
executions.

The arm selector (selector.py) measures, inside Caramel's graph of several steps, the plan
against the backend's own way of sending the gradients. Both arms run in that graph, with its
copies of the step, its switch and its stamps: a graph that may cost something of its own. So a
step function also measures that graph against the step exactly as the backend's own API runs
it: the user's step in a `tf.function` of one step, its gradients sent the backend's own way
(communicator.py), called once per step. Once the selector has chosen an arm, blocks of each
graph run in turn (the own graph first), BLOCK_PAIRS of each, every execution that built nothing
timed; then every rank takes rank 0's choice (one broadcast): Caramel's graph only if it measured
faster by more than MIN_GAIN. Caramel's graph is measured again each time its selector chooses
anew (a new plan, a changed link); the own graph, once chosen, runs for `exploit_steps` before
Caramel's graph is tried again. Everything here happens between executions, in Python, never
inside a step.
"""

from __future__ import annotations

import tensorflow as tf

from caramel.collectives.backend import Backend
from caramel.planner.rounds import BLOCK_PAIRS
from caramel.tensorflow.selector import MIN_GAIN

CARAMEL, OWN_GRAPH = "caramel", "own"
"""The graphs: Caramel's of several steps, and the backend's own of one step."""
# Steps the own graph runs, once chosen, before Caramel's is measured again.
DEFAULT_EXPLOIT_STEPS = 500


class GraphChoice:
    """Which graph runs the next steps (see the module's docstring). Every rank drives it with
    the same executions, so every rank measures and switches at the same step."""

    def __init__(self, block_steps: int, backend: Backend, exploit_steps: int = DEFAULT_EXPLOIT_STEPS) -> None:
        self._backend = backend
        self.block_steps = block_steps
        """Steps of one block: whole executions of Caramel's graph."""
        self.exploit_steps = exploit_steps
        self.chosen = CARAMEL
        self.running = CARAMEL
        """The graph the last full execution ran."""
        self.means: dict[str, float] = {}
        """Each graph's mean step in the last round measured (seconds)."""
        self._position: int | None = None
        """Steps into the round under way; None while none is."""
        self._seconds = {CARAMEL: 0.0, OWN_GRAPH: 0.0}
        self._counts = {CARAMEL: 0, OWN_GRAPH: 0}
        self._own_steps = 0
        """Steps the own graph has run since it was chosen."""

    @property
    def measuring(self) -> bool:
        return self._position is not None

    def set_block(self, steps: int) -> None:
        """Blocks of this many steps (whole executions of Caramel's graph)."""
        self.block_steps = steps

    def start_round(self) -> None:
        """Measure both graphs again, from the next execution."""
        self._position = 0
        self._seconds = {CARAMEL: 0.0, OWN_GRAPH: 0.0}
        self._counts = {CARAMEL: 0, OWN_GRAPH: 0}

    def next_graph(self) -> str:
        """The graph the next execution runs."""
        if self._position is None:
            return self.chosen
        return OWN_GRAPH if (self._position // self.block_steps) % 2 == 0 else CARAMEL

    def ran(self, graph: str, steps: int, timed_steps: int, timed_seconds: float) -> str | None:
        """`steps` steps of `graph` ran; `timed_steps` of them, which built nothing, took
        `timed_seconds`. Returns the round's outcome, for people, where this ended a round (on
        every rank), else None."""
        self.running = graph
        if self._position is None:
            if graph == OWN_GRAPH:
                self._own_steps += steps
                if self._own_steps >= self.exploit_steps:
                    self.chosen, self._own_steps = CARAMEL, 0  # try Caramel's graph again
            return None
        self._seconds[graph] += timed_seconds
        self._counts[graph] += timed_steps
        self._position += steps
        if self._position < 2 * BLOCK_PAIRS * self.block_steps:
            return None
        self._position = None
        self.means = {name: self._seconds[name] / self._counts[name] for name in self._seconds if self._counts[name]}
        self.chosen = self._decision(self.means)
        self._own_steps = 0
        caramel, own = (self.means.get(name, float("nan")) * 1e3 for name in (CARAMEL, OWN_GRAPH))
        own_graph = f"{self._backend.own_way_name} in a graph of one step"
        graph = "Caramel's graph of several steps" if self.chosen == CARAMEL else own_graph
        return f"steps run {graph}: measured {caramel:.4g} ms per step with Caramel's, {own:.4g} ms with {own_graph}"

    def _decision(self, means: dict[str, float]) -> str:
        """Rank 0's choice, on every rank: Caramel's graph only if it measured faster by MIN_GAIN."""
        caramel_faster = CARAMEL in means and OWN_GRAPH in means and means[CARAMEL] < (1.0 - MIN_GAIN) * means[OWN_GRAPH]
        choice = self._backend.broadcast([tf.constant(int(caramel_faster))], root_rank=0, name="caramel_graph_choice")[0]
        return CARAMEL if int(choice.numpy()) else OWN_GRAPH
