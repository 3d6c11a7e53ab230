"""Horovod's `horovod.tensorflow.compression`: Caramel's compressors, which follow Horovod's
protocol (`compress(tensor) -> (tensor, context)`, `decompress(tensor, context)`)."""

from caramel.tensorflow.compression import Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
