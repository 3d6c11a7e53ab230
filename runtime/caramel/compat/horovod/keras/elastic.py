"""Horovod's elastic training for standalone Keras (`horovod.keras.elastic`): that of
horovod.tensorflow.keras, on the Keras `tf.keras` is."""

from horovod.tensorflow.keras.elastic import (  # noqa: F401
    CommitStateCallback,
    KerasState,
    TensorFlowKerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)
