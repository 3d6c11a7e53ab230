"""Profiles replayed from the measured H200 timelines (benchmarks/accelerator_timelines.py): the
releases keep their measured order and spacing, the emulated layers group what is released
together, and a scale factor slows every time alike."""

from __future__ import annotations

import json

import pytest

from benchmarks.accelerator_timelines import TIMELINES, release_layers, timeline_names, timeline_profile
from benchmarks.profiles import MAX_LAYERS, layer_groups, load_profile, scaled, tensor_costs
from caramel.planner.schedule import TensorCost, release_times


def test_every_measured_model_is_a_profile() -> None:
    models = [model["model"] for model in json.loads(TIMELINES.read_text())["models"]]
    assert timeline_names() == tuple(f"h200_{model}" for model in models)
    assert {"h200_resnet50", "h200_densenet121", "h200_gpt2"} <= set(timeline_names())


@pytest.mark.parametrize("name", timeline_names())
def test_a_timelines_releases_keep_their_measured_order_and_spacing(name: str) -> None:
    measured = next(model for model in json.loads(TIMELINES.read_text())["models"] if f"h200_{model['model']}" == name)
    profile = load_profile(name)
    assert profile.parameters == sum(tensor["params"] for tensor in measured["timeline"])
    # Forward order is release order reversed: the first tensor of the profile is released last,
    # at the end of the backward pass, and the backward pass takes its measured time.
    ready = sorted(tensor["ready_ms"] for tensor in measured["timeline"])
    backward = sum(tensor.backward_seconds for tensor in profile.tensors)
    assert backward == pytest.approx(ready[-1] * 1e-3) and backward == pytest.approx(measured["bwd_ms"] * 1e-3, rel=1e-3)
    assert sum(tensor.forward_seconds for tensor in profile.tensors) == pytest.approx(measured["fwd_ms"] * 1e-3)
    # Each tensor's gradient comes at its measured time after the backward pass began.
    forward = sum(tensor.forward_seconds for tensor in profile.tensors)
    each_tensor = [TensorCost(t.parameters * 4, 4, t.forward_seconds, t.backward_seconds) for t in profile.tensors]
    releases = [seconds - forward for seconds in release_times(each_tensor)]
    assert sorted(round(seconds * 1e3, 3) for seconds in releases) == pytest.approx(sorted(round(r, 3) for r in ready), abs=2e-3)
    # Layers: at most MAX_LAYERS, each of tensors released within the same 1/MAX_LAYERS of the pass.
    layers = layer_groups(profile)
    assert 1 < len(layers) <= MAX_LAYERS and sum(len(layer) for layer in layers) == len(profile.tensors)


def test_tensors_released_in_the_same_share_of_the_pass_form_one_layer() -> None:
    # In forward order: released at 9.5, 9.0, 5.2, 5.1, 0.4 ms of a 10 ms pass, in 4 shares of 2.5 ms.
    assert release_layers([9.5, 9.0, 5.2, 5.1, 0.4], backward_ms=10.0, layers=4) == (2, 2, 1)


def test_a_timeline_slowed_k_times_takes_k_times_as_long() -> None:
    profile = timeline_profile("h200_resnet50")
    slower = scaled(profile, profile.device_tflops / 10)
    assert slower.compute_seconds == pytest.approx(10 * profile.compute_seconds)
    assert slower.layer_sizes == profile.layer_sizes and tensor_costs(slower)
    with pytest.raises(FileNotFoundError, match="no timeline profile 'h200_lenet'"):
        timeline_profile("h200_lenet")
