"""Models that Keras builds in their first step (a Sequential without an input shape, a subclassed
model taking a tuple of features) train under Horovod's Keras API and Caramel's own callback:
Keras' own first execution builds them, Caramel's steps run the rest. One rank here (that two end
alike is tests/horovod/test_horovod_api.py's)."""

from __future__ import annotations

import pytest

from test_horovod_api import results_of

FIT = """
import json
import numpy as np
import tensorflow as tf
import caramel.tensorflow as ctf
import horovod.tensorflow.keras as hvd
from caramel.tensorflow.keras import TrainingCallback
from caramel.tensorflow.runtime import current
hvd.init()


class TwoInputs(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.left, self.right = tf.keras.layers.Dense(8), tf.keras.layers.Dense(8)
        self.out = tf.keras.layers.Dense(1)

    def call(self, inputs):
        left, right = inputs
        return self.out(tf.nn.relu(self.left(left) + self.right(right)))


features = (np.random.rand(24, 3).astype("float32"), np.random.rand(24, 5).astype("float32"))
labels = np.random.rand(24, 1).astype("float32")
found = {}
"""
# One model per process: Caramel plans the communication of one set of trainable variables.
HOROVOD = """
sequential = tf.keras.Sequential([tf.keras.layers.Dense(16), tf.keras.layers.Dense(1)])
sequential.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse", steps_per_execution=2)
kept = tf.Variable(1.0)
callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[kept])
sequential.fit(features[0], labels, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
found["horovod"] = [int(sequential.optimizer.iterations.numpy()), len(sequential.trainable_variables)]
found["local"] = id(kept) in current().local_variables
print(json.dumps(found))
"""
CARAMEL = """
subclassed = TwoInputs()
subclassed.compile(optimizer=ctf.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss="mse", steps_per_execution=2)
caramel = TrainingCallback(subclassed)
data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(4)
subclassed.fit(data, epochs=2, initial_epoch=caramel.initial_epoch, callbacks=[caramel], verbose=0)
found["caramel"] = [int(subclassed.optimizer.iterations.numpy()), len(subclassed.trainable_variables)]
print(json.dumps(found))
"""


@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_models_built_by_their_first_batch_train_under_both_apis(keras):
    # Six batches per epoch, two epochs: every step ran, the first execution Keras' own.
    assert results_of(FIT + HOROVOD, keras=keras) == {"horovod": [12, 4], "local": True}
    assert results_of(FIT + CARAMEL, keras=keras) == {"caramel": [12, 6]}
