"""TensorFlow's graph optimizations (grappler) run on one step, once, for a graph of several steps.

TensorFlow optimizes a function's graph the first time it is called. Caramel's graph of several
steps holds one copy of the step per step (unrolled.py), and grappler's passes take several
times longer on it than on one step: on the emulated DenseNet-121 (364 gradients, 4 steps per
graph, 2 cores) they were most of the minute its first call took
(benchmarks/results/2026-12-02-build-and-exit-costs.txt). The copies are alike, so the step is
optimized once, on its own, and copied as optimized; the graph of the copies is then run with
grappler off. What grappler would still find across copies (a constant or a subexpression two
steps share) is not what a step of training spends its time on.

Only where the step runs on the CPU. Grappler's passes for a GPU (layout, the remapper's GPU
fusions) need the devices the nodes were placed on, which the optimization of a graph not yet
placed does not have; where a GPU is visible TensorFlow optimizes the graph of several steps
itself, as before (docs/gpu.md says what has not run on a GPU).

Function bodies are left as traced (`function_optimization` off): that pass inlines and lowers
them to TensorFlow 1's control flow, which a tf.function's graph cannot import. TensorFlow lowers
them itself when the graph of several steps is instantiated, grappler or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, device_properties_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.eager import context
from tensorflow.python.grappler import cluster as grappler_cluster
from tensorflow.python.grappler import tf_optimizer

# What the signature calls the step's inputs and outputs: names grappler keeps and feeds by.
_FEED, _FETCH = "feed_{}", "fetch_{}"


def optimizes_once() -> bool:
    """Whether steps are optimized once, on their own: where no GPU is visible."""
    return not tf.config.list_logical_devices("GPU")


def optimized_step(graph_def: graph_pb2.GraphDef, feeds: Sequence[tf.Tensor], fetches: Sequence[tf.Tensor]) -> graph_pb2.GraphDef:
    """The step's graph as grappler optimizes it, with the process's graph options: `feeds` (the
    batch and the captured tensors, placeholders of the step's graph) and `fetches` (its outputs)
    keep their names; grappler removes no node with a side effect (a variable's update, a
    collective, a stamp), however unused its outputs.
    The functions it adds to the graph's library are added to the eager context, where the graph of
    several steps that imports it finds them."""
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    signature = meta_graph.signature_def["step"]
    for index, tensor in enumerate(feeds):
        info = signature.inputs[_FEED.format(index)]
        info.name, info.dtype = tensor.name, tensor.dtype.as_datatype_enum
        info.tensor_shape.CopyFrom(tensor.shape.as_proto())
    for index, tensor in enumerate(fetches):
        info = signature.outputs[_FETCH.format(index)]
        info.name, info.dtype = tensor.name, tensor.dtype.as_datatype_enum
    config = config_pb2.ConfigProto()
    config.CopyFrom(context.context().config)
    config.graph_options.rewrite_options.function_optimization = rewriter_config_pb2.RewriterConfig.OFF
    optimized = tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False, cluster=_cpu_cluster())
    for function in optimized.library.function:
        # A function grappler rewrote keeps its name, and the context has it as traced: either
        # does the same, and the context refuses a second definition under one name.
        if not context.context().has_function(function.signature.name):
            context.context().add_function_def(function)
    return optimized


def without_grappler(call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` (a tf.function) run with grappler off: its graph is made of steps optimized already."""

    def unoptimized(*args: Any) -> Any:
        with _grappler_off():
            return call(*args)

    return unoptimized


@contextmanager
def _grappler_off() -> Iterator[None]:
    eager = context.context()
    options = eager.function_call_options
    config = config_pb2.ConfigProto()
    config.ParseFromString(options.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    eager.function_call_options = context.FunctionCallOptions(executor_type=options.executor_type, config_proto=config)
    try:
        yield
    finally:
        eager.function_call_options = options


def _cpu_cluster() -> grappler_cluster.Cluster:
    """A description of this process's CPU for grappler, instead of the machine grappler would
    otherwise start a session on to measure."""
    cpu = device_properties_pb2.NamedDevice(name="/job:localhost/replica:0/task:0/device:CPU:0")
    cpu.properties.type = "CPU"
    return grappler_cluster.Cluster(devices=[cpu])
