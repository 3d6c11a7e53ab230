"""Models nobody picked: hypothesis strategies for the planner's inputs.

A model is a list of `TensorCost`s in forward order. Sizes are drawn log-uniformly from a 4-byte
bias to a 400 MB embedding, so that a draw holds tiny and huge tensors together, as real models
do (BatchNorm scales beside VGG's fc6); item sizes are those of float16, float32 and float64;
layer times span four orders of magnitude, and may be zero (a parameter-free layer's share).
The zoo's profiles (benchmarks/profiles/) stand for models people train; these stand for the
ones nobody thought of.
"""

from __future__ import annotations

from hypothesis import strategies as st

from caramel.planner.linkmodel import LinkModel
from caramel.planner.schedule import TensorCost

MAX_TENSORS = 60
ITEM_SIZES = (2, 4, 8)


@st.composite
def tensor_costs(draw: st.DrawFn, max_tensors: int = MAX_TENSORS) -> list[TensorCost]:
    """A model's parameter tensors, in forward order."""
    count = draw(st.integers(min_value=1, max_value=max_tensors))
    tensors = []
    for _ in range(count):
        item = draw(st.sampled_from(ITEM_SIZES))
        elements = max(1, int(2 ** draw(st.floats(min_value=0, max_value=26.6))))  # up to ~100 M elements
        forward = draw(st.one_of(st.just(0.0), st.floats(min_value=1e-5, max_value=0.1)))
        tensors.append(TensorCost(elements * item, item, forward, 2 * forward))
    return tensors


@st.composite
def links(draw: st.DrawFn) -> LinkModel:
    """A link from a loopback to a slow Ethernet, with a fixed cost per collective of a tenth of
    a millisecond to a tenth of a second."""
    alpha = draw(st.floats(min_value=1e-4, max_value=0.1))
    bytes_per_second = draw(st.floats(min_value=1e7, max_value=1e10))
    return LinkModel(alpha=alpha, beta=1.0 / bytes_per_second)
