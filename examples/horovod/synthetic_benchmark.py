"""A benchmark written for Horovod's TensorFlow 2 API, run unchanged by Caramel: a
tf.keras.applications model on synthetic images, trained in a tf.function per step with
hvd.DistributedGradientTape, reporting images per second.

It has the shape of Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py: the same
flags, the same Horovod calls in the same places. What differs: an --image-size flag (224, the
original's size, by default), so that tests can run a model at a small size.

    caramel run examples/horovod/synthetic_benchmark.yaml
"""

import argparse
import os
import timeit

import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description='TensorFlow synthetic benchmark, Horovod style',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='compress the gradients to fp16 for the allreduce')
parser.add_argument('--model', type=str, default='ResNet50',
                    help='tf.keras.applications model to benchmark')
parser.add_argument('--batch-size', type=int, default=32,
                    help='images per rank per step')
parser.add_argument('--image-size', type=int, default=224,
                    help='height and width of the synthetic images')
parser.add_argument('--num-warmup-batches', type=int, default=10,
                    help='steps before the benchmark, not measured')
parser.add_argument('--num-batches-per-iter', type=int, default=10,
                    help='steps per benchmark iteration')
parser.add_argument('--num-iters', type=int, default=10,
                    help='benchmark iterations')
parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='do not use GPUs')

args = parser.parse_args()
args.cuda = not args.no_cuda

# Horovod: join the other ranks.
hvd.init()

# Horovod: one GPU per process, chosen by local rank (no-op without GPUs).
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

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    # Horovod: optional fp16 compression of the gradients on the wire.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)

    # Horovod: the tape averages the gradients over all ranks.
    tape = hvd.DistributedGradientTape(tape, compression=compression)

    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Horovod: every rank takes rank 0's variables, so that all start from the same state,
    # random or restored. After the first step, which made the optimizer's variables.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


log('Model: %s' % args.model)
log('Batch size: %d' % args.batch_size)
device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))


with tf.device(device):
    # Warm-up.
    log('Running warmup...')
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

    # The benchmark.
    log('Running benchmark...')
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
        img_secs.append(img_sec)

    # Results.
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log('Img/sec per %s: %.1f +-%.1f' % (device, img_sec_mean, img_sec_conf))
    log('Total img/sec on %d %s(s): %.1f +-%.1f' % (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))
