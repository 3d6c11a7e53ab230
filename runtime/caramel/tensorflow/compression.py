"""Gradient compression for the transfers, as Horovod's `Compression` has it: none, or fp16."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Casts a tensor for its transfer, and the transferred tensor back."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, context: Any) -> tf.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """Every tensor travels as it is."""


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (half the bytes), and are cast back."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, context: Any) -> tf.Tensor:
        return tensor if context is None else tf.cast(tensor, context)


class Compression:
    """The compressions a drop-in takes (`compression=Compression.fp16`)."""

    none = NoneCompressor
    fp16 = FP16Compressor
