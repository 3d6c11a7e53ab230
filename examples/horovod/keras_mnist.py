"""A script written for Horovod's Keras API, run unchanged by Caramel: a convolutional network on
MNIST-shaped data, trained by `model.fit` with Horovod's optimizer and callbacks.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py: the same Horovod
calls in the same places, Keras 2 idioms included (`experimental_run_tf_function=False`). What
differs: the images are synthetic (10 classes, each a fixed random pattern under noise) instead of
downloaded, the epochs, steps and batch size are flags (to keep runs short), and there is no
`horovod.run` entry (a CaramelJob starts the ranks). Rank 0 writes checkpoint-<epoch>.h5 into the
working directory, as Horovod's example does.

    caramel run examples/horovod/keras_mnist.yaml
"""

import argparse

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd


def load_synthetic_mnist(count=10000, seed=0):
    """Stands in for tf.keras.datasets.mnist.load_data(): (images, labels) pairs of 28x28 uint8
    images in 10 learnable classes, train and test."""
    rng = np.random.default_rng(seed)
    patterns = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint16)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    noise = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint16)
    images = ((3 * patterns[labels] + noise) // 4).astype(np.uint8)
    split = count * 6 // 7
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def train(args):
    # Horovod: join the other ranks.
    hvd.init()

    # Horovod: one GPU per process, chosen by local rank (no-op without GPUs).
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    (mnist_images, mnist_labels), _ = load_synthetic_mnist()

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000).batch(args.batch_size)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax'),
    ])

    # Horovod: scale the learning rate with the number of ranks (the global batch grows with it).
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: the optimizer averages the gradients over all ranks.
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # Horovod: `experimental_run_tf_function=False` made Keras 2 compute the gradients through
    # hvd.DistributedOptimizer.
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'],
                        experimental_run_tf_function=False)

    callbacks = [
        # Horovod: every rank takes rank 0's variables when training begins, so that all start
        # from the same state, random or restored.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: the epoch's metrics averaged over the ranks. Keep it before the callbacks that
        # read them (ReduceLROnPlateau, TensorBoard, ...).
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: start at scaled_lr / size and reach scaled_lr over the first three epochs
        # (Goyal et al., https://arxiv.org/abs/1706.02677): the full rate from the start hurts
        # the final accuracy.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: only rank 0 writes checkpoints, so that the ranks do not overwrite each other's.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))

    # Horovod: only rank 0 logs.
    verbose = 1 if hvd.rank() == 0 else 0

    # Horovod: the steps are shared among the ranks.
    mnist_model.fit(dataset, steps_per_epoch=args.steps_per_epoch // hvd.size(), callbacks=callbacks, epochs=args.epochs,
                    verbose=verbose)

    return mnist_model


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Horovod-style MNIST training with Keras fit')
    parser.add_argument('--epochs', type=int, default=24, help='epochs')
    parser.add_argument('--steps-per-epoch', type=int, default=500, help='steps per epoch over all ranks (each rank runs steps / ranks)')
    parser.add_argument('--batch-size', type=int, default=128, help='examples per rank per step')
    train(parser.parse_args())
