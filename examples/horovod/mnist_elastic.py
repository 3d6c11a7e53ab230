"""A script written for Horovod's elastic TensorFlow 2 API, run unchanged by Caramel: a
convolutional network on MNIST-shaped data in a custom loop, whose gang survives the loss of a
worker and takes it back while it trains.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_mnist_elastic.py: the same Horovod
calls in the same places (one step without the allreduce makes the optimizer's variables, the
state is the model, the optimizer and the batch, committed after every step, and a reset callback
scales the learning rate with the ranks). What differs: the images are synthetic (as in
mnist.py) instead of downloaded; the steps, the batch size and how often rank 0 logs are flags;
`state.batch` counts the steps done, so that a step is committed once done and never repeated
(Horovod's counts the step under way); and there is no `horovod.run` entry (a CaramelJob starts
the ranks: examples/horovod/mnist_elastic.yaml).

    caramel run examples/horovod/mnist_elastic.yaml
"""

import argparse
import time

import tensorflow as tf

import horovod.tensorflow as hvd
from mnist import mnist_convnet, synthetic_dataset


def main(args):
    # Horovod: join the other ranks.
    hvd.init()

    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    dataset = synthetic_dataset(args.batch_size)
    mnist_model = mnist_convnet()
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: scale the learning rate with the number of ranks (again after every reset).
    lr = 0.001
    opt = tf.optimizers.Adam(lr * hvd.size())

    @tf.function
    def training_step(images, labels, allreduce=True):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: the tape averages the gradients over the ranks.
        if allreduce:
            tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
        return loss_value

    # Horovod: make the model's and the optimizer's variables, so that the state can be synchronized.
    for images, labels in dataset.take(1):
        training_step(images, labels, allreduce=False)

    @hvd.elastic.run
    def train(state):
        for images, labels in dataset.skip(state.batch).take(args.steps - state.batch):
            loss_value = training_step(images, labels)
            state.batch += 1
            if state.batch % args.log_every == 0 and hvd.rank() == 0:
                print('Step #%d\tLoss: %.6f\tranks %d\t%.3f' % (state.batch, loss_value, hvd.size(), time.time()), flush=True)

            # Horovod: commit the state after every step (what a lost worker's peers roll back to).
            if state.batch % args.commit_every == 0:
                state.commit()

    def on_state_reset():
        opt.learning_rate.assign(lr * hvd.size())

    state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Horovod-style elastic MNIST training in a custom loop')
    parser.add_argument('--steps', type=int, default=10000, help='training steps of the whole run (every rank takes part in each)')
    parser.add_argument('--batch-size', type=int, default=128, help='examples per rank per step')
    parser.add_argument('--commit-every', type=int, default=1, help='steps between commits')
    parser.add_argument('--log-every', type=int, default=10, help='steps between rank 0\'s lines')
    main(parser.parse_args())
