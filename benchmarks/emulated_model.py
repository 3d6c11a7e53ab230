"""An emulated accelerator as a Keras model: the parameter tensors of a profiled model, grouped into
at most `profiles.MAX_LAYERS` layers of consecutive tensors, whose forward and backward passes take the
profile's times, and whose gradients are real tensors of the parameters' true shapes.

Grouping bounds what the emulation itself costs: every emulated kernel is a Python call and a
few TensorFlow ops, and on the 2-core bench machine one layer per tensor of a model of hundreds
of tensors took a large share of each rank's CPU per step, which the real collectives' traffic
then lacked, and made tracing slow (figures: benchmarks/results/2026-11-27-figures-from-code-comments.txt). A group is what one layer of the real model
is to its tensors (a convolution's kernel and bias, a norm's scale and shift): its gradients are
released together at the end of its backward pass, and its forward pass reads all of its
weights. At 64 layers, every model still has a forward and backward pass of many steps.

The layer's compute is slept (in `tf.numpy_function`, which releases the GIL while sleeping),
so that the machine's two cores are left to the real collectives' traffic over the shaped links
(Horovod's over Gloo, TensorFlow's over gRPC): the benchmark then shows the scheduling, not a
fight for the CPU. The model is an ordinary Keras 3 model, trained through each library's public
API (`model.fit` with Caramel's optimizer or under MultiWorkerMirroredStrategy, or a tape in a
tf.function: Horovod's, Caramel's, the strategy's), so the benchmark measures the path users take.
Its layers' weights are Keras 3 variables; the gradients reach them, and the `tf.Variable`s under
them that plain Horovod's tape is given (plain_horovod.py), through the reads recorded below.

The compute runs in one of two ways (`KERNELS`), reported side by side by the benchmarks:
    graph-ops     each kernel is an ordinary op of the step's graph that sleeps its time where it
                  runs, as a real kernel computes where it runs: nothing catches up afterwards, so
                  any wait the graph adds before a kernel (a transfer it is made to wait for, a
                  thread it cannot get) lengthens the step.
    device-clock  the kernels share one emulated device's timeline, slept against deadlines: a
                  late wake-up of a Python thread (two cores, busy with the collectives) shortens
                  the next sleep instead of adding up over hundreds of layers, as a real
                  accelerator's queued kernels would. That also hides a loss of overlap whose
                  wait is short, so it is kept beside graph-ops, not instead of it.

Either way, the forward kernel reads a slice of each of its weights, so it runs only once that
weight's last update is applied, as a real layer would; the loss depends on every layer's output;
and a gradient is a real tensor of its weight's shape, which exists only once its layer's backward
kernel has run, made as `GRADIENTS` say:
    computed      computed from the backward kernel's output and the weight (the weight scaled by
                  a value of that output), a new tensor of the weight's size in every step, as a
                  real gradient is: what making, holding and copying it costs the CPU shows
    weights       the weight's own value (nothing to compute, no copy; the zoo's gradients before
                  2026-12-02), after a control dependency on the kernel
    unshaped      computed, and of no static shape (as a `tf.py_function`'s without `set_shape`)
The backward kernel is a stateful op: grappler may drop a control dependency on a stateless op, and
then prunes the kernel whose output nothing else reads (a stateless backward kernel, or one
whose gradients were reshaped from a shape it output, was gone from the optimized graph). A
stateful op without a resource input runs in program order with the others of its function: the
backward kernels, in backpropagation's order, which their data imposes anyway (TensorFlow's
collectives take an ordering token, and Horovod's are not stateful, so neither waits for them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record  # tf.custom_gradient's own recording, without its leak

from benchmarks.profiles import Profile, TensorProfile, layer_groups
from benchmarks.workloads import COMPUTED, GRADIENTS, UNSHAPED, WEIGHTS

# A wake-up later than this after the device became free counts as the device idling (it waited
# for a parameter); an earlier one is scheduling noise, which a device's queue would hide.
CATCH_UP_SECONDS = 0.002
GRAPH_OPS, DEVICE_CLOCK = "graph-ops", "device-clock"
KERNELS = (GRAPH_OPS, DEVICE_CLOCK)
"""How the emulated compute runs (see the module's docstring)."""


class DeviceClock:
    """An emulated accelerator: a timeline of kernel times, slept against deadlines.

    Like a real accelerator, whose kernels are queued ahead, the device does not wait for the
    host: a late wake-up of a Python thread (two cores, busy with Gloo) shortens the next sleep
    instead of adding up over hundreds of layers, unless the device really stood idle.
    """

    def __init__(self) -> None:
        self._free_at = time.perf_counter()
        self._lock = threading.Lock()

    def run(self, seconds: float) -> None:
        with self._lock:
            now = time.perf_counter()
            start = self._free_at if now - self._free_at < CATCH_UP_SECONDS else now
            self._free_at = start + seconds
            delay = self._free_at - now
        if delay > 0:
            time.sleep(delay)


class Kernels:
    """The emulated layers' kernels: ops of the step's graph that take the profile's times."""

    def __init__(self, kind: str, gradients: str = COMPUTED) -> None:
        if kind not in KERNELS:
            raise ValueError(f"emulated kernels run as {' or '.join(KERNELS)}, not {kind!r}")
        if gradients not in GRADIENTS:
            raise ValueError(f"emulated gradients are {', '.join(GRADIENTS)}, not {gradients!r}")
        self.kind = kind
        self.gradients = gradients
        self._clock = DeviceClock() if kind == DEVICE_CLOCK else None

    def _sleep(self, seconds: float) -> None:
        if self._clock is not None:
            self._clock.run(seconds)
        else:
            time.sleep(seconds)

    def forward(self, x: tf.Tensor, weights: Sequence[tf.Tensor], seconds: float, name: str) -> tf.Tensor:
        """x, once `seconds` were spent on it and a slice of every weight was read."""
        first_elements = tf.concat([tf.reshape(weight, [-1])[:1] for weight in weights], axis=0)

        def run(value: np.ndarray, _: np.ndarray) -> np.ndarray:
            self._sleep(seconds)
            return value

        y = tf.numpy_function(run, [x, first_elements], x.dtype, stateful=False, name=f"{name}_forward")
        y.set_shape(x.shape)
        return tf.identity(y)

    def backward(self, upstream: tf.Tensor, weights: Sequence[tf.Tensor], seconds: float, name: str) -> list[tf.Tensor]:
        """The gradient of the layer's input and of each of its weights, once `seconds` were spent.
        The kernel's op is named `name`_backward (step_timeline.py finds it by that name)."""

        def run(value: np.ndarray) -> np.ndarray:
            self._sleep(seconds)
            return value

        dx = tf.numpy_function(run, [upstream], upstream.dtype, stateful=True, name=f"{name}_backward")
        dx.set_shape(upstream.shape)
        if self.gradients == WEIGHTS:
            with tf.control_dependencies([dx]):
                return [dx, *(tf.identity(weight) for weight in weights)]
        # A value only the kernel's output knows (the upstream gradient's first element, over itself: 1).
        scale = tf.math.divide_no_nan(dx[0, 0], dx[0, 0])
        gradients = [weight * scale for weight in weights]
        if self.gradients == UNSHAPED:
            gradients = [tf.raw_ops.PlaceholderWithDefault(input=gradient, shape=tf.TensorShape(None)) for gradient in gradients]
        return [dx, *gradients]


class EmulatedLayer(tf.keras.layers.Layer):
    """Consecutive parameter tensors of the profile and the compute attributed to them."""

    def __init__(self, kernels: Kernels, tensors: Sequence[TensorProfile], **kwargs) -> None:
        super().__init__(**kwargs)
        self.kernels = kernels
        self.shapes = [tensor.shape or (1,) for tensor in tensors]
        self.forward_seconds = sum(tensor.forward_seconds for tensor in tensors)
        self.backward_seconds = sum(tensor.backward_seconds for tensor in tensors)

    def build(self, input_shape: tf.TensorShape) -> None:
        initializer = tf.keras.initializers.RandomUniform(-1.0, 1.0)
        self.parameter_variables = [self.add_weight(name=f"weight_{i}", shape=shape, initializer=initializer) for i, shape in enumerate(self.shapes)]

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        weights = [tf.convert_to_tensor(weight) for weight in self.parameter_variables]  # reads on the tape: the gradients reach the variables
        with record.stop_recording():
            outputs = self.kernels.forward(inputs, weights, self.forward_seconds, self.name)

        def gradient(upstream: tf.Tensor) -> list[tf.Tensor]:
            return self.kernels.backward(upstream, weights, self.backward_seconds, self.name)

        # What tf.custom_gradient does, minus its global registration of a gradient function
        # per call, which would keep every traced step graph alive (and with it, at every
        # re-plan's re-trace, tens of MB that a real model's layers would not keep).
        record.record_operation("EmulatedLayer", [outputs], [inputs, *weights], gradient)
        return outputs


def build_model(profile: Profile, kernels: str = GRAPH_OPS, gradients: str = COMPUTED) -> tf.keras.Model:
    """The profile's layers in forward order, taking inputs of shape [batch, 1], their compute
    run as `kernels` (KERNELS) say, their gradients made as `gradients` (GRADIENTS) say."""
    emulated = Kernels(kernels, gradients)
    layers = [EmulatedLayer(emulated, group, name=f"layer_{i}") for i, group in enumerate(layer_groups(profile))]
    model = tf.keras.Sequential(layers)
    model.build((None, 1))
    return model


def loss(_: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """A loss whose gradient depends on every layer's output (so no forward kernel is pruned)."""
    return tf.reduce_mean(outputs * outputs)


def dataset() -> tf.data.Dataset:
    """Endless [1, 1] batches; the values do not matter, only that they reach the graph at run time.
    tf.data's autotuner is off: this pipeline has nothing to tune, and its thread held the
    iterator's teardown at the end of a job for up to a minute, on every path alike (TensorFlow's;
    benchmarks/results/2026-12-07-zoo-jobs200-autotune-off.txt)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensors((tf.ones([1, 1]), tf.zeros([1, 1]))).repeat().with_options(options)
