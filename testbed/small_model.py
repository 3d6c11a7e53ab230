"""The tests' small model: an MLP that learns a fixed random teacher's classes, with its
optimizer, loss and synthetic batches.

testbed's workers train it through Caramel's paths, and the tests compute what plain
synchronous SGD gives on it. Every (step, rank) pair draws its own batch from a stateless seed,
so every run sees the same data at the same step. It is the tests' own: the examples are scripts
for users, which nothing imports.
"""

import tensorflow as tf

FEATURES, CLASSES = 32, 10
SEED = 1234
DEFAULT_LEARNING_RATE = 0.05
# The teacher whose classes the model learns: the same on every rank and in every run.
TEACHER = tf.random.stateless_normal([FEATURES, CLASSES], seed=[7, 7])
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def batch(step: int, rank: int, size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Rank `rank`'s batch of step `step`: features and the teacher's classes of them."""
    features = tf.random.stateless_normal([size, FEATURES], seed=[step, rank])
    return features, tf.argmax(features @ TEACHER, axis=1)


def build_model(hidden: int, built: bool = True) -> tf.keras.Model:
    """Two hidden ReLU layers of `hidden` units and a layer of the classes' logits: 6 variables.
    Not `built`, it has no input shape: Keras builds it in its first step."""
    layers = [tf.keras.layers.Dense(hidden, activation="relu") for _ in range(2)] + [tf.keras.layers.Dense(CLASSES)]
    model = tf.keras.Sequential(layers)
    if built:
        model.build((None, FEATURES))
    return model


def build_optimizer(learning_rate: float) -> tf.keras.optimizers.Optimizer:
    return tf.keras.optimizers.SGD(learning_rate, momentum=0.9)
