"""A benchmark written for Horovod's Keras API, run unchanged by Caramel: a tf.keras.applications
model on synthetic images, trained by `model.fit` with Horovod's optimizer and callbacks,
reporting images per second.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py: the
same flags, the same Horovod calls in the same places, Keras 2 idioms included. What differs: an
--image-size flag (224, the original's size, by default), so that tests can run a model at a
small size.

    caramel run examples/horovod/keras_synthetic_benchmark.yaml
"""

import argparse
import os
from timeit import default_timer as timer

import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description='TensorFlow synthetic benchmark with Keras fit, Horovod style',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='compress the gradients to fp16 for the allreduce')
parser.add_argument('--model', type=str, default='ResNet50',
                    help='tf.keras.applications model to benchmark')
parser.add_argument('--batch-size', type=int, default=32,
                    help='images per rank per step')
parser.add_argument('--image-size', type=int, default=224,
                    help='height and width of the synthetic images')
parser.add_argument('--num-batches-per-iter', type=int, default=10,
                    help='steps per benchmark iteration (an epoch)')
parser.add_argument('--num-iters', type=int, default=10,
                    help='benchmark iterations (epochs)')
parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='do not use GPUs')

args = parser.parse_args()
args.cuda = not args.no_cuda
device = 'GPU' if args.cuda else 'CPU'

# Horovod: join the other ranks.
hvd.init()

if hvd.rank() == 0:
    print('Model: %s' % args.model)
    print('Batch size: %d' % args.batch_size)
    print('Number of %ss: %d' % (device, hvd.size()))

# Horovod: one GPU per process, chosen by local rank (no-op without them).
if args.cuda:
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

# The model, untrained.
model = getattr(applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3))
opt = tf.optimizers.SGD(0.01)

# Synthetic data, the same batch over and over.
data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)

# Horovod: optional fp16 compression of the gradients on the wire.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: the optimizer averages the gradients over all ranks.
opt = hvd.DistributedOptimizer(opt, compression=compression)

# Horovod: `experimental_run_tf_function=False` made Keras 2 compute the gradients through
# hvd.DistributedOptimizer.
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
              optimizer=opt,
              experimental_run_tf_function=False)

callbacks = [
    # Horovod: every rank takes rank 0's variables when training begins, so that all start from
    # the same state, random or restored.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: the epoch's metrics averaged over the ranks. Keep it before the callbacks that read
    # them (ReduceLROnPlateau, TensorBoard, ...).
    hvd.callbacks.MetricAverageCallback(),
]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_train_end(self, logs=None):
        img_sec_mean = np.mean(self.img_secs)
        img_sec_conf = 1.96 * np.std(self.img_secs)
        print('Img/sec per %s: %.1f +-%.1f' % (device, img_sec_mean, img_sec_conf))
        print('Total img/sec on %d %s(s): %.1f +-%.1f' % (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))

    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timer()

    def on_epoch_end(self, epoch, logs=None):
        time = timer() - self.starttime
        img_sec = args.batch_size * args.num_batches_per_iter / time
        print('Iter #%d: %.1f img/sec per %s' % (epoch, img_sec, device))
        # The first epoch warms up: left out.
        if epoch > 0:
            self.img_secs.append(img_sec)


# Horovod: only rank 0 logs.
if hvd.rank() == 0:
    timing = TimingCallback()
    callbacks.append(timing)

# Train the model.
model.fit(
    dataset,
    batch_size=args.batch_size,
    steps_per_epoch=args.num_batches_per_iter,
    callbacks=callbacks,
    epochs=args.num_iters,
    verbose=0,
)
