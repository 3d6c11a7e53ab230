"""Local gradient accumulation (Horovod's `backward_passes_per_step`) as Horovod does it: the
gradients of N passes summed on each rank, one reduction and one update every N passes, the
optimizer's `iterations` counting every pass; eagerly, in a tf.function, in Caramel's graph of
several copies of one trace, and in Keras' fit under Caramel's callback. One rank here (what
two give is tests/horovod/test_horovod_api.py's synchronous SGD)."""

from __future__ import annotations

import numpy as np
import pytest

from test_horovod_api import results_of

PASSES, RATE = 3, 0.5
COEFFICIENTS = [[1.0, 0.0], [2.0, 1.0], [0.5, 4.0], [1.0, 1.0], [3.0, 2.0], [1.0, 5.0], [2.0, 2.0]]
"""Pass k's gradient of loss = sum(w * c_k) is c_k."""

PASSES_SCRIPT = f"""
import json
import tensorflow as tf
import caramel.tensorflow as ctf
from caramel.tensorflow.unrolled import TracedStep
ctf.init()
COEFFICIENTS = {COEFFICIENTS!r}
found = {{}}
for mode in ("eager", "function", "copies"):
    weights = tf.Variable([1.0, 2.0])
    optimizer = ctf.DistributedOptimizer(tf.keras.optimizers.SGD({RATE}), backward_passes_per_step={PASSES},
                                         average_aggregated_gradients=AVERAGE)
    optimizer.build([weights])

    def step(c):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * c)
        optimizer.apply_gradients([(tape.gradient(loss, weights), weights)])
        return loss

    seen = []
    if mode == "copies":  # Caramel's graph of several steps: one trace, copied per step
        data = iter(tf.data.Dataset.from_tensor_slices(tf.constant(COEFFICIENTS)))
        TracedStep(step, data.element_spec).copies(len(COEFFICIENTS), lambda index: {{}})(data)
    else:
        run = tf.function(step) if mode == "function" else step
        for c in COEFFICIENTS:
            run(tf.constant(c))
            seen.append(weights.numpy().tolist())
    found[mode] = {{"seen": seen, "weights": weights.numpy().tolist(), "iterations": int(optimizer.iterations.numpy()),
                   "counter": int(optimizer._agg_helper.counter.numpy())}}
print(json.dumps(found))
"""


def horovods_weights(average: bool) -> list[list[float]]:
    """The weights after each pass: an update of the passes' summed gradients (or their mean) every PASSES passes."""
    weights, total, seen = np.array([1.0, 2.0]), np.zeros(2), []
    for index, coefficients in enumerate(COEFFICIENTS, start=1):
        total += coefficients
        if index % PASSES == 0:
            weights, total = weights - RATE * (total / PASSES if average else total), np.zeros(2)
        seen.append(weights.tolist())
    return seen


@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
@pytest.mark.parametrize("average", [False, True], ids=["summed", "averaged"])
def test_one_update_every_n_passes_eagerly_in_a_function_and_in_copies_of_one_trace(keras, average):
    found = results_of(PASSES_SCRIPT.replace("AVERAGE", str(average)), keras=keras)
    expected = horovods_weights(average)
    for mode, run in found.items():
        if run["seen"]:
            np.testing.assert_allclose(run["seen"], expected, rtol=1e-6, err_msg=mode)
        np.testing.assert_allclose(run["weights"], expected[-1], rtol=1e-6, err_msg=mode)
        # Every pass counts in iterations; the count of passes accumulated is Horovod's counter.
        assert (run["iterations"], run["counter"]) == (len(COEFFICIENTS), len(COEFFICIENTS) % PASSES), mode


def test_a_sum_that_was_not_finite_does_not_outlive_its_passes():
    """Keras 2's compute_gradients returns what Horovod's does: the sums so far, the reduced sums
    on the Nth pass. An infinite gradient in the first N passes is gone from the next N (the
    accumulators are set to zero, not the sums subtracted, which would leave NaN)."""
    found = results_of("""
        import json
        import tensorflow as tf
        import caramel.tensorflow as ctf
        ctf.init()
        x = tf.Variable(0.0)
        optimizer = ctf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=2)
        returned = []
        for scale in (float("inf"), 1.0, 1.0, 1.0):
            pairs = optimizer._compute_gradients(lambda: x * scale, var_list=[x])
            optimizer.apply_gradients(pairs)
            returned.append(float(pairs[0][0].numpy()))
        print(json.dumps({"returned": returned, "iterations": int(optimizer.iterations.numpy())}))
    """, keras=2)
    assert found == {"returned": [float("inf"), float("inf"), 1.0, 2.0], "iterations": 4}


def test_fit_under_caramels_callback_accumulates_across_executions():
    """Keras' fit with TrainingCallback, three steps per execution and two passes per update, so
    that the passes of one update straddle two executions: the weights of SGD on the summed
    gradients of each pair of batches."""
    found = results_of("""
        import json
        import numpy as np
        import tensorflow as tf
        import caramel.tensorflow as ctf
        from caramel.tensorflow.keras import TrainingCallback
        ctf.init()

        def model():
            tf.keras.utils.set_random_seed(3)
            built = tf.keras.Sequential([tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
            built.build((None, 3))
            return built

        features = tf.random.stateless_normal([12, 3], seed=[1, 2])
        labels = tf.random.stateless_normal([12, 1], seed=[3, 4])
        trained = model()
        trained.compile(optimizer=ctf.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=2),
                        loss="mse", steps_per_execution=3)
        data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)
        trained.fit(data, epochs=2, steps_per_epoch=3, callbacks=[TrainingCallback(trained)], verbose=0)

        expected = model()
        for pair in range(3):
            total = None
            for index in (2 * pair, 2 * pair + 1):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(expected(features[2 * index:2 * index + 2]) - labels[2 * index:2 * index + 2]))
                gradients = tape.gradient(loss, expected.trainable_variables)
                total = gradients if total is None else [a + b for a, b in zip(total, gradients)]
            for variable, gradient in zip(expected.trainable_variables, total):
                variable.assign_sub(0.1 * gradient)
        print(json.dumps({"iterations": int(trained.optimizer.iterations.numpy()),
                          "differences": [float(np.max(np.abs(a.numpy() - b.numpy())))
                                          for a, b in zip(trained.trainable_variables, expected.trainable_variables)]}))
    """)
    assert found["iterations"] == 6
    assert max(found["differences"]) < 1e-6, found
