"""A script written for Horovod's elastic Keras API, run unchanged by Caramel: a convolutional
network on MNIST-shaped data trained by `model.fit`, whose gang survives the loss of a worker and
takes it back while it trains.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_keras_mnist_elastic.py: the same
Horovod calls in the same places (`KerasState` with the batch and the epoch, the three elastic
callbacks, a reset callback that scales the learning rate with the ranks, `fit` inside
`hvd.elastic.run`). What differs: the images are synthetic (as in mnist.py) instead of
downloaded, the epochs, steps, batch size and commit interval are flags, the model is built
before the state is made (KerasState needs its variables), and there is no `horovod.run` entry
(a CaramelJob starts the ranks: examples/horovod/keras_mnist_elastic.yaml).

    caramel run examples/horovod/keras_mnist_elastic.yaml
"""

import argparse

import tensorflow as tf

import horovod.tensorflow.keras as hvd
from mnist import mnist_convnet, synthetic_dataset


def main(args):
    hvd.init()

    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    dataset = synthetic_dataset(args.batch_size)
    mnist_model = mnist_convnet()
    mnist_model.build((None, 28, 28, 1))

    # Horovod: scale the learning rate with the number of ranks (again after every reset).
    lr = 0.001
    opt = tf.optimizers.Adam(lr * hvd.size())

    # Horovod: the optimizer averages the gradients over the ranks.
    opt = hvd.DistributedOptimizer(opt)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'],
                        experimental_run_tf_function=False)

    def on_state_reset():
        mnist_model.optimizer.learning_rate.assign(lr * hvd.size())

    state = hvd.elastic.KerasState(mnist_model, batch=0, epoch=0)
    state.register_reset_callbacks([on_state_reset])

    callbacks = [
        # Horovod: average the epoch's metrics over the ranks.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: elastic training callbacks to keep the batch and the epoch, and commit the state.
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
    ]

    verbose = 2 if hvd.rank() == 0 else 0

    @hvd.elastic.run
    def train(state):
        mnist_model.fit(dataset, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                        epochs=args.epochs - state.epoch, verbose=verbose)

    train(state)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Horovod-style elastic Keras MNIST training')
    parser.add_argument('--epochs', type=int, default=24)
    parser.add_argument('--steps-per-epoch', type=int, default=500)
    parser.add_argument('--batch-size', type=int, default=128, help='examples per rank per step')
    parser.add_argument('--batches-per-commit', type=int, default=10)
    main(parser.parse_args())
