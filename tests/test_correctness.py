"""Every scheduling mode gives the results of plain synchronous SGD, with real Horovod ranks."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, job_manifest, run_caramel, write_manifest

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "tests"))
import layerwise_worker  # noqa: E402
import train_small  # noqa: E402

MODES = {
    "automatic": {},
    "horovod-order-unbatched": {"ordering": "arrival", "batching": "off"},
    "small-chunks": {"batching": "fixed", "minBucketBytes": 1024, "maxBucketBytes": 65536},
    "replanning": {"minBucketBytes": 4096, "maxBucketBytes": 262144, "replanIntervalSteps": 3},
}
RANKS = 2


@pytest.mark.parametrize("mode", MODES)
def test_layerwise_engine_matches_synchronous_sgd(tmp_path, mode):
    steps = 12
    output = tmp_path / "weights.npz"
    command = [sys.executable, str(REPO / "tests" / "layerwise_worker.py"), "--steps", str(steps), "--output", str(output)]
    manifest = job_manifest(script=None, command=command, args=[], caramel=MODES[mode], workers={"replicas": RANKS})
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr

    expected = [np.zeros(size, np.float32) for size in layerwise_worker.SIZES]
    for step in range(steps):
        for index, weight in enumerate(expected):
            mean_noise = np.mean([layerwise_worker.noise(step, rank, index).numpy() for rank in range(RANKS)], axis=0)
            expected[index] = weight - layerwise_worker.LEARNING_RATE * (0.5 * weight + mean_noise)
    saved = np.load(output)
    for index, weight in enumerate(expected):
        np.testing.assert_allclose(saved[f"arr_{index}"], weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_tape_training_matches_synchronous_sgd(tmp_path, mode):
    steps, batch, hidden = 15, 16, 32
    manifest = job_manifest(
        args=["--steps", str(steps), "--batch-size", str(batch), "--hidden", str(hidden)],
        caramel=MODES[mode],
        checkpoint={"path": str(tmp_path / "ckpt"), "intervalSteps": 1000},
        workers={"replicas": RANKS},
    )
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr

    # Plain synchronous SGD in this process: one model, the global batch of every rank.
    tf.keras.utils.set_random_seed(train_small.SEED)
    model = train_small.build_model(hidden)
    optimizer = train_small.build_optimizer(train_small.DEFAULT_LEARNING_RATE)
    for step in range(1, steps + 1):
        with tf.GradientTape() as tape:
            losses = [train_small.LOSS(labels, model(features)) for features, labels in (train_small.batch(step, rank, batch) for rank in range(RANKS))]
            loss = tf.add_n(losses) / RANKS
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt"))
    saved = sorted(
        name for name in reader.get_variable_to_shape_map() if name.startswith("model/") and "OPTIMIZER_SLOT" not in name
    )
    assert len(saved) == len(model.trainable_variables) == 6
    expected = {
        f"model/layer_with_weights-{index // 2}/{'kernel' if index % 2 == 0 else 'bias'}/.ATTRIBUTES/VARIABLE_VALUE": variable.numpy()
        for index, variable in enumerate(model.trainable_variables)
    }
    for name, value in expected.items():
        np.testing.assert_allclose(reader.get_tensor(name), value, rtol=1e-5, atol=1e-6, err_msg=name)
