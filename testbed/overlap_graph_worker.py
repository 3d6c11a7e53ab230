"""A training process that reports what each collective of its step's optimized graph waits for.

    python -m testbed.overlap_graph_worker --api per-step|hvd-script|function [--unshaped 2 ...] --output report.json

The model is a chain of layers whose weight gradients each come out of one op named
`released_<layer>`, so that in the graph TensorFlow runs (after its optimizations and the
lowering of functional control flow, collected with `enable_graph_collection`) every collective
of a step can be traced back to the gradients it carries and to the ones it waits for:
    carried  layers whose gradient reaches the collective by data edges
    waits    layers whose gradient is an ancestor of the collective by any edge (data or control)
Only ancestors in the same step count: a step of a graph of several steps waits for the steps
before it through the parameters it reads, as every step does.

    per-step    the step in a tf.function of its own, called once per step, with Caramel's tape
    hvd-script  the same with Horovod's tape as Caramel serves it (`import horovod.tensorflow`)
    function    the same step through `ctf.function`, several steps per graph: the backend's own
                way and the plan in force, the two branches of each step's switch

With `--unshaped`, the gradients of those layers have no static shape (as a `tf.py_function`'s
without `set_shape`). Rank 0 writes, per graph that holds collectives, each collective's name, op,
carried and waits.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.eager import context

import caramel.tensorflow as ctf
from caramel.tensorflow.runtime import current, plan_with
from testbed.lab import lab_policy

# Layers of 4 MiB each: as large as the tensorflow backend's buckets, so that each is a
# collective of its own there too.
LAYERS, WIDTH, BATCH = 6, 1024, 8
COLLECTIVES = ("HorovodAllreduce", "HorovodGroupedAllreduce", "CollectiveReduceV2")
RELEASED = re.compile(r"(?:^|/)released_layer_(\d+)(?:_\d+)?$")
STEP_COPY = re.compile(r"^(caramel_step_\d+/)")


class ReleasingLayer(tf.keras.layers.Layer):
    """x @ w, whose gradient of w is made by one op named `released_<layer>`: a Python function, which
    grappler neither folds into its neighbours nor renames (a named `tf.identity` it removes).
    That gradient's static shape is w's, or, `unshaped`, unknown."""

    def __init__(self, unshaped: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unshaped = unshaped

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(name="kernel", shape=(WIDTH, WIDTH), initializer="glorot_uniform")

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        @tf.custom_gradient
        def matmul(x: tf.Tensor, w: tf.Tensor) -> Any:
            def gradient(upstream: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                released = tf.numpy_function(lambda value: value, [tf.transpose(x) @ upstream], tf.float32, stateful=False, name=f"released_{self.name}")
                if not self.unshaped:
                    released.set_shape(w.shape)
                return upstream @ tf.transpose(w), released

            return tf.nn.relu(x @ w) + x, gradient

        return matmul(inputs, tf.convert_to_tensor(self.kernel))


def ancestors(nodes: dict[str, Any], name: str, data_only: bool) -> set[str]:
    seen: set[str] = set()
    pending = [name]
    while pending:
        node = nodes.get(pending.pop())
        if node is None:
            continue
        for source in node.input:
            if data_only and source.startswith("^"):
                continue
            producer = source.lstrip("^").split(":")[0]
            if producer not in seen:
                seen.add(producer)
                pending.append(producer)
    return seen


def released_layers(names: Iterable[str], copy: str) -> list[int]:
    return sorted({int(match.group(1)) for name in names if name.startswith(copy) for match in [RELEASED.search(name)] if match})


def collectives_of(graph: graph_pb2.GraphDef) -> list[dict[str, Any]]:
    nodes = {node.name: node for node in graph.node}
    report = []
    for node in graph.node:
        if node.op not in COLLECTIVES:
            continue
        copy = match.group(1) if (match := STEP_COPY.match(node.name)) else ""
        report.append({
            "name": node.name, "op": node.op,
            "carried": released_layers(ancestors(nodes, node.name, data_only=True), copy),
            "waits": released_layers(ancestors(nodes, node.name, data_only=False), copy),
        })  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, choices=("per-step", "hvd-script", "function"))
    parser.add_argument("--steps", type=int, default=24, help="steps of the per-step paths")
    parser.add_argument("--unshaped", type=int, nargs="*", default=[], help="layers whose gradients have no static shape")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    # A run this short would keep one step per graph; the graphs of several steps are the ones to see.
    plan_with(replace(lab_policy(), long_training=True))  # with a test's lab settings (testbed/lab.py)
    tape_of: Callable[..., Any]
    broadcast: Callable[..., Any]
    if args.api == "hvd-script":
        import horovod.tensorflow as hvd  # Caramel's, first on the path of every training process

        hvd.init()
        tape_of, broadcast = hvd.DistributedGradientTape, hvd.broadcast_variables
    else:
        ctf.init()
        tape_of, broadcast = ctf.DistributedGradientTape, ctf.broadcast_variables
    runtime = current()
    context.context().enable_graph_collection()  # graphs are collected as functions are instantiated
    model = tf.keras.Sequential([ReleasingLayer(index in args.unshaped, name=f"layer_{index}") for index in range(LAYERS)])
    model.build((None, WIDTH))
    broadcast(model.variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(1e-3)

    def step(features: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(features) ** 2)
        gradients = tape_of(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    data = tf.data.Dataset.from_tensors(tf.random.stateless_normal([BATCH, WIDTH], seed=[1, runtime.rank])).repeat()
    if args.api == "function":
        # Until the first plan is decided (searched beside the steps, in a process of its own),
        # and then two executions of Caramel's graph of several steps.
        steps = ctf.function(step, steps_per_execution=4)
        iterator = iter(data)
        while not runtime.communicator.control.replanner.measured:
            steps(iterator)
        for _ in range(2):
            steps(iterator)
    else:
        per_step = tf.function(step)
        for features in data.take(args.steps):
            per_step(features)
    graphs = [graph for function in context.context().export_run_metadata().function_graphs for graph in function.partition_graphs]
    if runtime.rank == 0:
        reports = [collectives for collectives in map(collectives_of, graphs) if collectives]
        with open(args.output, "w") as output:
            json.dump({"layers": LAYERS, "graphs": reports}, output)


if __name__ == "__main__":
    main()
