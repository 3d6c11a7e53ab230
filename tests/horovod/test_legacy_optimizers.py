"""Keras 2's legacy optimizers (tf.keras.optimizers.legacy.*) where tf.keras is Keras 2: wrapped as
the others (their apply_gradients takes its own keyword for skipping the replicas' sum, they
make their state in `_create_all_weights`), trained under fit, checkpointed and restored as the
ledger does it, and loaded by hvd.load_model(legacy_opts=True). Keras 3 has none (refused by name:
tests/horovod/test_horovod_api.py's REFUSED)."""

from __future__ import annotations

from test_horovod_api import results_of


def test_a_legacy_optimizer_trains_checkpoints_restores_and_loads():
    found = results_of("""
        import json, os, tempfile
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd
        from caramel.tensorflow.keras_version import optimizer_state
        hvd.init()

        def model():
            built = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)), tf.keras.layers.Dense(1)])
            built.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.01)), loss="mse")
            return built

        trained = model()
        x, y = np.random.rand(16, 3).astype("float32"), np.random.rand(16, 1).astype("float32")
        trained.fit(x, y, batch_size=4, epochs=1, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)], verbose=0)
        directory = tempfile.mkdtemp()
        path = tf.train.Checkpoint(model=trained, optimizer=trained.optimizer).write(os.path.join(directory, "ckpt"))

        restored = model()
        state = optimizer_state(restored.optimizer, restored.trainable_variables)  # as the ledger builds it before restoring
        tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).read(path).assert_existing_objects_matched()
        saved = [v.numpy() for v in trained.optimizer.variables()]
        trained.save(os.path.join(directory, "model.h5"))
        loaded = hvd.load_model(os.path.join(directory, "model.h5"), legacy_opts=True)
        print(json.dumps({
            "legacy": isinstance(trained.optimizer, tf.keras.optimizers.legacy.Adam),
            "distributed": getattr(type(trained.optimizer), "_caramel_distributed", False),
            "iterations": int(trained.optimizer.iterations.numpy()),
            "restored": len(state) == len(saved) and all(np.allclose(a.numpy(), b) for a, b in zip(state, saved)),
            "loaded": [isinstance(loaded.optimizer, tf.keras.optimizers.legacy.Adam), getattr(type(loaded.optimizer), "_caramel_distributed", False)],
        }))
    """, keras=2)
    assert found == {"legacy": True, "distributed": True, "iterations": 4, "restored": True, "loaded": [True, True]}
