"""A script written for Horovod's TensorFlow 2 API, run unchanged by Caramel: a convolutional
network on MNIST-shaped data, trained in a custom loop with hvd.DistributedGradientTape.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_mnist.py: the same Horovod calls in
the same places (the variables are broadcast after the first step, once the optimizer has made
its own). What differs: the images are synthetic (10 classes, each a fixed random pattern under
noise) instead of downloaded, the steps and the batch size are flags (to keep runs short), and
there is no `horovod.run` entry (a CaramelJob starts the ranks).

    caramel run examples/horovod/mnist.yaml
"""

import argparse

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd


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


def synthetic_dataset(batch_size):
    """The training images and labels, repeated, shuffled and batched, as Horovod's examples make them."""
    (mnist_images, mnist_labels), _ = load_synthetic_mnist()
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
    )
    return dataset.repeat().shuffle(10000).batch(batch_size)


def mnist_convnet():
    """The convolutional network of Horovod's MNIST examples."""
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax'),
    ])


def train(args):
    # Horovod: join the other ranks.
    hvd.init()

    # Horovod: one GPU per process, chosen by local rank (no-op without GPUs).
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    dataset = synthetic_dataset(args.batch_size)
    mnist_model = mnist_convnet()
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: scale the learning rate with the number of ranks (the global batch grows with it).
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = './checkpoints'
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: the tape averages the gradients over all ranks.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: every rank takes rank 0's variables, so that all start from the same state,
        # random or restored. After the first step, which made the optimizer's variables.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)

        return loss_value

    # Horovod: the steps are shared among the ranks.
    for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)

        if batch % 10 == 0 and hvd.local_rank() == 0:
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))

    # Horovod: only rank 0 writes checkpoints, so that the ranks do not overwrite each other's.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)
        return mnist_model


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Horovod-style MNIST training in a custom loop')
    parser.add_argument('--steps', type=int, default=10000, help='training steps over all ranks (each rank runs steps / ranks)')
    parser.add_argument('--batch-size', type=int, default=128, help='examples per rank per step')
    train(parser.parse_args())
