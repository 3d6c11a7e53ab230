"""Fusion: tensors moved by one collective per dtype, as one flat buffer.

A collective moves one dtype, and a collective per tensor costs a collective's fixed cost per
tensor. So the tensors of one call are grouped by dtype, each group joined into one flat buffer,
moved, and cut back into the tensors' shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

GroupReduce = Callable[[list[tf.Tensor], str], list[tf.Tensor]]
"""Reduces tensors of one dtype over all ranks: (tensors, name) -> reduced tensors."""


def per_dtype(tensors: Sequence[tf.Tensor], name: str, reduce_group: GroupReduce) -> list[tf.Tensor]:
    """The tensors reduced by `reduce_group`, one call per dtype; a call's name is `name` where
    the tensors have one dtype, and `name` and the dtype's otherwise."""
    dtypes = list(dict.fromkeys(tensor.dtype for tensor in tensors))
    outputs: list[tf.Tensor | None] = [None] * len(tensors)
    for dtype in dtypes:
        members = [i for i, tensor in enumerate(tensors) if tensor.dtype == dtype]
        group_name = name if len(dtypes) == 1 else f"{name}_{dtype.name}"
        for i, reduced in zip(members, reduce_group([tensors[i] for i in members], group_name)):
            outputs[i] = reduced
    return outputs


def joined(tensors: Sequence[tf.Tensor], name: str, reduce_flat: Callable[[tf.Tensor, str], tf.Tensor]) -> list[tf.Tensor]:
    """The tensors joined into one flat buffer per dtype, each reduced by `reduce_flat`, and cut
    back into the tensors' shapes."""

    def one_buffer(group: list[tf.Tensor], group_name: str) -> list[tf.Tensor]:
        flat = [tf.reshape(tensor, [-1]) for tensor in group]
        reduced = reduce_flat(flat[0] if len(flat) == 1 else tf.concat(flat, axis=0), group_name)
        if len(group) == 1:
            return [tf.reshape(reduced, tf.shape(group[0]))]
        sizes = [tensor.shape.num_elements() if tensor.shape.is_fully_defined() else tf.size(tensor) for tensor in group]
        return [tf.reshape(part, tf.shape(tensor)) for part, tensor in zip(tf.split(reduced, sizes), group)]

    return per_dtype(tensors, name, one_buffer)
