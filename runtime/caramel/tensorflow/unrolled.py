"""Several training steps in one graph, from one trace of the step.

Caramel's transfer boundaries need several steps in one graph (see steps.py). Tracing a step is
Python, and slow for a model of many tensors, and tracing it k times over for a k-step graph
costs k times that. So the step is traced once, into a graph of its own, and that graph is
copied into the multi-step graph once per step (`import_graph_def`, which is C++ and a little
Python per operation), far cheaper than tracing (figures: benchmarks/results/2026-11-27-figures-from-code-comments.txt). Each copy is the step exactly as traced, but that the captured tensors a
copy should see differently (each step's stamps go to a variable of its own) are mapped per
copy. tf.function's automatic control dependencies then order the copies' operations on each
variable in program order, step after step, and nothing else, exactly as they order a step
traced several times over: step k+1 reads a parameter as soon as step k's update of it is
applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import importer

from caramel.tensorflow.step_optimization import optimized_step, without_grappler

class TracedStep:
    """A step traced once, as a graph that takes one batch, flattened."""

    def __init__(self, step: Callable[[Any], Any], element_spec: Any) -> None:
        self.element_spec = element_spec
        flat_specs = tf.nest.flatten(element_spec, expand_composites=True)

        def one_step(*flat: tf.Tensor) -> Any:
            return step(tf.nest.pack_sequence_as(element_spec, list(flat), expand_composites=True))

        self.function = tf.function(one_step, autograph=False).get_concrete_function(*flat_specs)
        graph = self.function.graph
        if graph.deferred_external_captures:
            raise ValueError("a step that captures values by reference (deferred captures) cannot run several steps per graph")
        self._inputs = [tensor.name for tensor in graph.inputs[: len(flat_specs)]]
        self._captures = list(graph.captures)
        self._outputs = [tensor.name for tensor in graph.outputs]
        self._graph_def = graph.as_graph_def()
        self.optimized = False
        """Whether the step's graph is as grappler optimized it (`optimize`): its copies then run
        without grappler."""

    def bypass_identity_n(self, scope: str) -> None:
        """Let consumers of an IdentityN of the outputs of a `switch_case` named `scope` read those
        outputs directly (see `bypass_identity_n`)."""
        bypass_identity_n(self._graph_def, scope)

    @property
    def graph_def(self) -> graph_pb2.GraphDef:
        """The step's graph, as copied."""
        return self._graph_def

    def optimize(self) -> None:
        """Optimize the step's graph once, on its own, for every copy (step_optimization.py)."""
        graph = self.function.graph
        self._graph_def = optimized_step(self._graph_def, graph.inputs, graph.outputs)
        self.optimized = True

    def copies(self, count: int, captures: Callable[[int], Mapping[int, tf.Tensor]]) -> Callable[[Iterator[Any]], list[Any]]:
        """A tf.function that runs `count` steps on the next `count` batches of an iterator and
        returns each step's outputs. In copy i, the captures of the external tensors keyed by
        `id` in `captures(i)` are replaced by theirs."""

        def steps(iterator: Iterator[Any]) -> list[Any]:
            outer = tf.compat.v1.get_default_graph()
            outputs = []
            for index in range(count):
                batch = tf.nest.flatten(next(iterator), expand_composites=True)
                replaced = captures(index)
                input_map = dict(zip(self._inputs, batch))
                for external, internal in self._captures:
                    input_map[internal.name] = outer.capture(replaced.get(id(external), external))
                flat = importer.import_graph_def(self._graph_def, input_map=input_map, return_elements=self._outputs, name=f"caramel_step_{index}")
                outputs.append(tf.nest.pack_sequence_as(self.function.structured_outputs, flat, expand_composites=True))
            return outputs

        execution = tf.function(steps, autograph=False)
        return without_grappler(execution) if self.optimized else execution


def bypass_identity_n(graph_def: graph_pb2.GraphDef, scope: str) -> None:
    """In place: an IdentityN fed by a `switch_case` named `scope` (or `scope_N`, a second one in
    the graph) no longer holds its consumers until all of its inputs exist; each reads its own
    input directly.

    Keras' optimizers sum the gradients over the replicas of a tf.distribute strategy before they
    apply them, and without one (a Caramel job) the sum is an identity: one IdentityN over every
    gradient (tf.custom_gradient's forward pass). It is an identity for each tensor, but it runs
    once all of them exist, so no parameter is updated before the step's last transfer ends, and
    the next step's forward pass, which reads the first layers' parameters first, waits for the
    transfer the plan sends last. Data through an IdentityN is its input; a control dependency on
    one waits for all its inputs, and keeps doing so."""
    in_scope = re.compile(f"(^|.*/){re.escape(scope)}(_[0-9]+)?/.*")  # the case and the Identity ops of its outputs
    called = {node.name for node in graph_def.node if in_scope.fullmatch(node.name)}
    barriers = {
        node.name: list(node.input)
        for node in graph_def.node
        if node.op == "IdentityN" and any(_producer(name) in called for name in node.input if not name.startswith("^"))
    }
    for node in graph_def.node:
        data: list[str] = []
        control: list[str] = []
        for name in node.input:
            producer, _, index = name.lstrip("^").partition(":")
            if producer not in barriers:
                (control if name.startswith("^") else data).append(name)
            elif name.startswith("^"):
                control += [f"^{_producer(source)}" for source in barriers[producer] if not source.startswith("^")]
            else:
                data.append(barriers[producer][int(index or 0)])
        del node.input[:]
        node.input.extend(data + list(dict.fromkeys(control)))  # control inputs come last


def _producer(tensor_name: str) -> str:
    return tensor_name.lstrip("^").partition(":")[0]
