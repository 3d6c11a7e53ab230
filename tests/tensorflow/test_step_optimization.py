"""A step optimized once by grappler, on its own, and copied into a graph of several steps
(caramel.tensorflow.step_optimization): the copies give what the step as traced gives, keep the
side effects that nothing returned depends on, and the process's function call options are
left as they were."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import context

from caramel.tensorflow.unrolled import TracedStep

BATCHES = [[1.0, 0.0], [2.0, 1.0], [0.5, 4.0]]


def run_copies(optimize: bool) -> tuple[list[float], list[float], int, int]:
    """Each step's loss, the weights and the counter after the copies, and the step's node count."""
    weights, counter = tf.Variable([1.0, 2.0]), tf.Variable(0)

    def step(batch: tf.Tensor) -> tf.Tensor:
        counter.assign_add(1)  # a side effect that no output depends on
        scale = tf.constant(2.0) * tf.constant(3.0)  # grappler folds it
        loss = tf.reduce_sum(weights * batch) * scale
        with tf.control_dependencies([loss]):
            weights.assign_sub(0.1 * batch)
        return loss

    data = iter(tf.data.Dataset.from_tensor_slices(tf.constant(BATCHES)))
    traced = TracedStep(step, data.element_spec)
    if optimize:
        traced.optimize()
    losses = traced.copies(len(BATCHES), lambda index: {})(data)
    return [float(loss) for loss in losses], weights.numpy().tolist(), int(counter.numpy()), len(traced.graph_def.node)


def test_copies_of_the_step_optimized_once_train_as_the_step_traced_and_keep_its_side_effects() -> None:
    losses, weights, counter, nodes = run_copies(optimize=False)
    options = context.context().function_call_options.config_proto_serialized
    optimized_losses, optimized_weights, optimized_counter, optimized_nodes = run_copies(optimize=True)
    assert optimized_losses == losses and optimized_weights == weights
    assert optimized_counter == counter == len(BATCHES)
    assert optimized_nodes < nodes  # grappler did optimize the step
    assert context.context().function_call_options.config_proto_serialized == options
