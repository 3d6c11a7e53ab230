"""Model profiles for the emulated-accelerator benchmark: every parameter tensor, in forward order,
with its true shape and the forward and backward time of the layer that uses it on the
emulated device. Written by `python -m benchmarks.make_profiles` into profiles/NAME.json.

    profile = load_profile("resnet50")
    faster = scaled(profile, device_tflops=10.0)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from caramel.planner.schedule import TensorCost

PROFILE_DIRECTORY = Path(__file__).resolve().parent / "profiles"
# The scheduling bench's own profiles, which Caramel was first tuned on; its default.
TUNED = ("resnet50", "vgg16", "bert_base")
# Models the bench was not tuned on (benchmarks/zoo_bench.py says which regime each stands for).
ZOO = (
    "densenet121", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "nasnet_mobile", "inception_v3",
    "xception", "resnet152_v2", "convnext_tiny", "vgg19", "gpt2_small", "t5_small", "vit_b16",
)  # fmt: skip
NAMES = TUNED + ZOO
BYTES_PER_PARAMETER = 4  # float32 gradients
# The emulated accelerator runs a model's tensors as at most this many layers of consecutive
# tensors (emulated_model.py says why).
MAX_LAYERS = 64


@dataclass(frozen=True)
class TensorProfile:
    name: str
    shape: tuple[int, ...]
    forward_seconds: float
    backward_seconds: float

    @property
    def parameters(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Profile:
    name: str
    batch_size: int
    device_tflops: float
    tensors: tuple[TensorProfile, ...]
    description: str = ""
    layer_sizes: tuple[int, ...] = ()
    """How many consecutive tensors each emulated layer holds, where the profile says
    (accelerator_timelines.py: by release time); otherwise `layer_groups` makes them even."""

    @property
    def parameters(self) -> int:
        return sum(tensor.parameters for tensor in self.tensors)

    @property
    def gradient_bytes(self) -> int:
        return self.parameters * BYTES_PER_PARAMETER

    @property
    def compute_seconds(self) -> float:
        """Forward plus backward time of one step on the emulated device."""
        return sum(tensor.forward_seconds + tensor.backward_seconds for tensor in self.tensors)


def layer_groups(profile: Profile, layers: int = MAX_LAYERS) -> list[Sequence[TensorProfile]]:
    """The profile's tensors, in order, in groups of consecutive tensors: the emulated layers,
    each released and read as one. Where the profile gives no `layer_sizes`, at most `layers`
    groups, as even in count as they divide."""
    tensors = profile.tensors
    if profile.layer_sizes:
        bounds = [sum(profile.layer_sizes[:index]) for index in range(len(profile.layer_sizes) + 1)]
    else:
        count = min(layers, len(tensors))
        bounds = [round(i * len(tensors) / count) for i in range(count + 1)]
    return [tensors[start:stop] for start, stop in zip(bounds, bounds[1:])]


def tensor_costs(profile: Profile) -> list[TensorCost]:
    """The planner's view of the profile as the emulated accelerator runs it: every gradient of a
    layer is released when the layer's backward pass ends, and every parameter of a layer is
    read when its forward pass starts. (The planner takes a gradient as released after its own
    backward time, counted from the last tensor back, and a parameter as read after the forward
    times of the tensors before it: so each layer's times go to its last tensor.)"""
    costs = []
    for layer in layer_groups(profile):
        forward, backward = sum(t.forward_seconds for t in layer), sum(t.backward_seconds for t in layer)
        for position, tensor in enumerate(layer):
            last = position == len(layer) - 1
            costs.append(TensorCost(tensor.parameters * BYTES_PER_PARAMETER, BYTES_PER_PARAMETER, forward if last else 0.0, backward if last else 0.0))
    return costs


def load_profile(name: str) -> Profile:
    """The profile `name`: one of NAMES, or a measured accelerator timeline (`h200_<model>`)."""
    # Imported here: the timelines' module builds on this one's Profile.
    from benchmarks.accelerator_timelines import is_timeline, timeline_profile

    if is_timeline(name):
        return timeline_profile(name)
    path = PROFILE_DIRECTORY / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no profile {name!r} ({path}); profiles: {', '.join(NAMES)}, and the timelines h200_<model>")
    document = json.loads(path.read_text())
    tensors = tuple(
        TensorProfile(t["name"], tuple(t["shape"]), t["forward_seconds"], t["backward_seconds"])
        for t in document["tensors"]
    )
    return Profile(
        name=document["name"],
        batch_size=document["batch_size"],
        device_tflops=document["device_tflops"],
        tensors=tensors,
        description=document.get("device", ""),
    )


def scaled(profile: Profile, device_tflops: float) -> Profile:
    """The same model on a device of another rate: every layer time scales by old rate / new rate."""
    factor = profile.device_tflops / device_tflops
    tensors = tuple(
        dataclasses.replace(t, forward_seconds=t.forward_seconds * factor, backward_seconds=t.backward_seconds * factor)
        for t in profile.tensors
    )
    return dataclasses.replace(profile, device_tflops=device_tflops, tensors=tensors)
