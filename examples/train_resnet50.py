"""ResNet-50 (about 23.7 M parameters) on synthetic images.

A model the size of the real workloads Caramel targets, for measuring communication on a
realistic gradient mix. Images and labels are synthetic, drawn per (step, rank) from a stateless
seed, so runs are reproducible and resumable. Keras builds the architecture; no weights are
downloaded.
"""

import argparse

import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.tensorflow.training import TrainingRun

SEED = 1234
MIN_IMAGE_SIZE = 32  # ResNet-50's five stride-2 stages need at least 32 x 32
LOSS = tf.keras.losses.SparseCategoricalCrossentropy()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ResNet-50 on synthetic images with Caramel.")
    parser.add_argument("--steps", type=int, default=50, help="total training steps (default 50)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank per step (default 16)")
    parser.add_argument("--image-size", type=int, default=64, help="image height and width, at least 32 (default 64)")
    parser.add_argument("--classes", type=int, default=100, help="number of classes (default 100)")
    parser.add_argument("--learning-rate", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    args = parser.parse_args()
    if args.image_size < MIN_IMAGE_SIZE:
        parser.error(f"--image-size must be at least {MIN_IMAGE_SIZE} for ResNet-50, got {args.image_size}")
    return args


def build_model(image_size: int, classes: int) -> tf.keras.Model:
    return tf.keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3), classes=classes)


def build_optimizer(learning_rate: float) -> tf.keras.optimizers.Optimizer:
    return tf.keras.optimizers.SGD(learning_rate, momentum=0.9)


def batch(step: int, rank: int, size: int, image_size: int, classes: int) -> tuple[tf.Tensor, tf.Tensor]:
    seed = [step, rank]
    images = tf.random.stateless_uniform([size, image_size, image_size, 3], seed=seed)
    labels = tf.random.stateless_uniform([size], seed=seed, maxval=classes, dtype=tf.int32)
    return images, labels


def main() -> None:
    args = parse_args()
    ctf.init()
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(args.image_size, args.classes)
    # The wrapped optimizer averages the gradients over all ranks before applying them.
    optimizer = ctf.DistributedOptimizer(build_optimizer(args.learning_rate))

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = LOSS(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    run = TrainingRun(model, optimizer, total_steps=args.steps, batch_size=args.batch_size)
    for step in run.steps():
        run.report_loss(train_step(*batch(step, ctf.rank(), args.batch_size, args.image_size, args.classes)))


if __name__ == "__main__":
    main()
