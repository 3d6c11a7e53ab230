"""Keras 3's `fit` against tf-keras's (Keras 2), one process, no distribution.

Plain Horovod runs the Horovod-shaped scripts on tf-keras, because Horovod's own Python API
breaks on Keras 3, while Caramel runs them on Keras 3 (`horovod_scripts_bench`). This separates
what Keras itself costs from what Caramel's path does: the Keras synthetic benchmark's model
and batch, trained by `model.fit` alone.

    python -m benchmarks.keras_fit_probe                        # Keras 3
    TF_USE_LEGACY_KERAS=1 python -m benchmarks.keras_fit_probe  # tf-keras
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of fit (default 60)")
    parser.add_argument("--warmup", type=int, default=15, help="first steps left out of the median (default 15)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup}: must be at least 0 and fewer than --steps ({args.steps}), or no step is measured")
    keras: Any = tf.keras  # tf-keras where TF_USE_LEGACY_KERAS=1, Keras 3 otherwise
    model = keras.applications.MobileNetV2(weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    images = np.random.rand(args.batch_size, args.image_size, args.image_size, 3).astype("float32")
    labels = np.random.randint(0, 1000, size=(args.batch_size,))
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(args.batch_size)
    seconds: list[float] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds.append(time.perf_counter() - self.started)

    model.fit(data.take(args.steps), steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[StepTimer()])
    keras_name = "tf-keras (Keras 2)" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "Keras 3"
    steady = seconds[args.warmup :]
    print(f"{keras_name}: median step {1000 * statistics.median(steady):.1f} ms over {len(steady)} steps")


if __name__ == "__main__":
    main()
