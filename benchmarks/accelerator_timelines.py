"""Profiles replayed from real accelerator timelines: one training step of a model measured on an
NVIDIA H200, every gradient released at its measured time.

    profile = timeline_profile("h200_resnet50")      # the H200 itself
    slower = scaled(profile, 1 / 10)                  # every time x10: "an H200 on 10 GbE" at 1 Gbit/s

`profiles/h200-step-timelines.json` holds, per model, the forward and backward pass (fwd_ms,
bwd_ms) and, for every parameter tensor, when its gradient was ready after the backward pass
began (ready_ms), measured with CUDA events on an H200 (PyTorch 2.11, bf16 autocast; the file's
`what` says more). Two cores cannot run an H200, but only the ratio of compute to communication,
and the order and spacing of the gradients' releases, decide what overlap and order can win: with
every time multiplied by k and the link divided by k, an H200 on 10 GbE is this machine at 1 Gbit/s
for k = 10, and on 25 GbE at 2.5 Gbit/s.

A profile is the emulated accelerator's input (profiles.py): tensors in forward order, each with
the backward time after which its gradient is released and a forward time. Here the release
order is the measured one (the tensors in forward order are the timeline's, last released
first), each tensor's backward time is the gap between its release and the one before it, so
the releases keep their measured spacing, and the forward pass, which the timeline gives only as
a total, is shared among the tensors as their backward times are. The emulated accelerator runs
a model as at most `profiles.MAX_LAYERS` layers: the tensors released within the same
1/MAX_LAYERS of the backward pass form one layer, released at its last tensor's time, so that no
gradient is held back by more than that share of the pass.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

from benchmarks.profiles import MAX_LAYERS, PROFILE_DIRECTORY, Profile, TensorProfile

TIMELINES = PROFILE_DIRECTORY / "h200-step-timelines.json"
PREFIX = "h200_"
"""A timeline profile's name: the prefix and the timeline's model."""
MILLISECONDS = 1e-3
BASE_RATE = 1.0
"""A timeline profile's device rate: 1 is the H200 that was measured; `profiles.scaled` to 1/k
multiplies every time by k."""


@cache
def _timelines(path: Path = TIMELINES) -> dict[str, dict]:
    return {model["model"]: model for model in json.loads(path.read_text())["models"]}


def timeline_names() -> tuple[str, ...]:
    """The profiles the timelines make, one per measured model."""
    return tuple(f"{PREFIX}{model}" for model in _timelines())


def is_timeline(name: str) -> bool:
    return name.startswith(PREFIX)


def timeline_profile(name: str) -> Profile:
    """The profile of the timeline `name` (`h200_<model>`), at the H200's own speed."""
    model = name.removeprefix(PREFIX)
    timelines = _timelines()
    if not is_timeline(name) or model not in timelines:
        raise FileNotFoundError(f"no timeline profile {name!r} ({TIMELINES}); timeline profiles: {', '.join(timeline_names())}")
    measured = timelines[model]
    released = sorted(measured["timeline"], key=lambda tensor: tensor["ready_ms"])
    backward_ms, forward_ms = float(measured["bwd_ms"]), float(measured["fwd_ms"])
    gaps = [tensor["ready_ms"] - before["ready_ms"] for before, tensor in zip([{"ready_ms": 0.0}, *released], released)]
    forward_share = forward_ms / sum(gaps)
    in_forward_order = list(zip(released, gaps))[::-1]
    tensors = tuple(
        TensorProfile(
            tensor["name"], tuple(tensor["shape"]) or (1,), forward_seconds=gap * forward_share * MILLISECONDS, backward_seconds=gap * MILLISECONDS
        )
        for tensor, gap in in_forward_order
    )
    return Profile(
        name=name,
        batch_size=_batch(measured["batch"]),
        device_tflops=BASE_RATE,
        tensors=tensors,
        description=f"{measured['device']}, {measured['torch']}: forward {forward_ms:g} ms, backward {backward_ms:g} ms",
        layer_sizes=release_layers([tensor["ready_ms"] for tensor, _ in in_forward_order], backward_ms),
    )


def release_layers(ready_ms: list[float], backward_ms: float, layers: int = MAX_LAYERS) -> tuple[int, ...]:
    """Tensor counts of the layers, in forward order, of tensors (given in forward order, with
    their release times) released within the same 1/`layers` of the backward pass."""
    width = backward_ms / layers
    bins = [min(layers - 1, math.floor(ready / width)) for ready in ready_ms]
    sizes: list[int] = []
    for index, current in enumerate(bins):
        if index and current == bins[index - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return tuple(sizes)


def _batch(batch: int | str) -> int:
    """The timeline's batch: a number of examples, or GPT-2's "16 x 1024 tokens" (sequences)."""
    return batch if isinstance(batch, int) else int(str(batch).split()[0])
