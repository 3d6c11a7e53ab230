"""Model profiles for the emulated-accelerator benchmark: every parameter tensor, in forward order,
with its true shape and the forward and backward time of the layer that uses it on the
emulated device. Written by make_profiles.py into profiles/NAME.json.

    profile = load_profile("resnet50")
    faster = scaled(profile, device_tflops=10.0)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

PROFILE_DIRECTORY = Path(__file__).resolve().parent / "profiles"
NAMES = ("resnet50", "vgg16", "bert_base")
BYTES_PER_PARAMETER = 4  # float32 gradients


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


def load_profile(name: str) -> Profile:
    path = PROFILE_DIRECTORY / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no profile {name!r} ({path}); profiles: {', '.join(NAMES)}")
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
