"""Caramel: faster data-parallel TensorFlow training, on Kubernetes or on one machine."""

__version__ = "0.1.0"
