"""Timestamps taken inside a step's graph, read after the step, without ordering anything else.

A plain `tf.timestamp()` is a stateful op without a resource input, and tf.function's
automatic control dependencies chain every such op of a function in program order: with the
user's own stateful ops (a `tf.print`, a `py_function`), and across the steps of a multi-step
graph. One stamp after a transfer would then hold up the next step's forward pass. A stamp
here is a call of a small function that reads an anchor variable: an op with a resource input
(read only), which automatic control dependencies order against writes of that variable alone,
and nobody writes it. The timestamp inside runs as soon as its dependencies exist.

Each step's stamps go into a variable of their own (one per place of the step in its
execution), written once at the end of the step, and read from Python after the execution
(`read`). The variables are best made before the graph is traced (`reserve`): a variable made
while tracing makes tf.function trace the whole function twice, once to make it and once more
without making it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from caramel.tensorflow.devices import HOST


class StampBook:
    """Stamps of the steps of one process, one variable per step of an execution."""

    def __init__(self) -> None:
        with tf.init_scope(), tf.device(HOST):
            self._anchor = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="caramel_stamp_anchor")
        self._stores: dict[int, tf.Variable] = {}
        self._flags: dict[int, tf.Variable] = {}

        # Any shape: one small function per dtype, however many tensors are stamped.
        @tf.function(autograph=False, reduce_retracing=True)
        def stamp(anchor: tf.Variable, after: tf.Tensor) -> tf.Tensor:
            with tf.device(HOST), tf.control_dependencies([after]):
                return tf.timestamp() + 0.0 * anchor.read_value()

        self._stamp = stamp
        self._now = tf.constant(0.0, tf.float64)

    def stamp(self, after: tf.Tensor | None = None) -> tf.Tensor:
        """In a graph: the time once `after` exists (at once if None). The tensor is passed as
        it is, not copied."""
        return self._stamp(self._anchor, self._now if after is None else after)

    def read(self, slot: int) -> np.ndarray | None:
        """The stamps last written to `slot`; None if none were."""
        store = self._stores.get(slot)
        return None if store is None else store.numpy()

    def flag(self, slot: int, value: bool) -> tf.Variable:
        """A boolean variable of slot `slot`, made with `value` if there is none yet."""
        if slot not in self._flags:
            with tf.init_scope(), tf.device(HOST):
                self._flags[slot] = tf.Variable(value, trainable=False, name=f"caramel_stamp_flag_{slot}")
        return self._flags[slot]

    def reserve(self, slot: int) -> tf.Variable:
        """The variable of slot `slot` (the step's place in its execution), made if there is none
        yet. Its length is left open: plans differ in their stamps."""
        if slot not in self._stores:
            with tf.init_scope(), tf.device(HOST):
                self._stores[slot] = tf.Variable(
                    tf.zeros([0], tf.float64), shape=tf.TensorShape([None]), trainable=False, name=f"caramel_stamps_{slot}"
                )
        return self._stores[slot]
