"""The bounds of a model's release and read order (benchmarks/step_bounds.py)."""

import pytest

from benchmarks.profiles import BYTES_PER_PARAMETER, NAMES, Profile, TensorProfile, load_profile, tensor_costs
from benchmarks.step_bounds import ordered_bounds
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import Batching, Ordering
from caramel.planner.schedule import Batch, build_schedule, simulate

MB = 1_000_000


def profile_of(*layers: tuple[int, float, float]) -> Profile:
    """(gradient bytes, forward s, backward s) per layer, in forward order."""
    tensors = tuple(
        TensorProfile(f"layer_{i}", (nbytes // BYTES_PER_PARAMETER,), forward, backward) for i, (nbytes, forward, backward) in enumerate(layers)
    )
    return Profile("test", batch_size=1, device_tflops=1.0, tensors=tensors)


def test_a_large_first_layer_leaves_no_order_anything_to_gain():
    # Layer 0 (80 MB) is released last and read first: whatever the order, the next forward
    # pass starts once its 0.8 s transfer ends, and layer 1's bytes went during layer 0's
    # backward pass. A schedule whose step waits for its transfers does as well.
    profile = profile_of((80 * MB, 0.5, 0.5), (20 * MB, 0.5, 0.5))
    bounds = ordered_bounds(profile, compute_seconds=2.0, comm_seconds=1.0)
    assert bounds.any_schedule == pytest.approx(2.0 + 0.8)
    assert bounds.step_barrier == pytest.approx(2.0 + 0.8)


def test_small_first_layers_leave_a_window_to_a_schedule_without_a_step_barrier():
    # The next forward pass needs only layer 0's 1 MB (0.01 s) before it starts, and reads
    # layer 1 once its 0.5 s forward is done; a step that waits for its transfers waits for
    # layer 1's 99 MB (0.99 s), of which 0.49 s went during layer 0's backward pass.
    profile = profile_of((1 * MB, 0.5, 0.5), (99 * MB, 0.5, 0.5))
    bounds = ordered_bounds(profile, compute_seconds=2.0, comm_seconds=1.0)
    assert bounds.any_schedule == pytest.approx(2.0 + 0.01)
    assert bounds.step_barrier == pytest.approx(2.0 + 0.5)


def test_the_link_bounds_a_step_that_communicates_longer_than_it_computes():
    profile = profile_of((1 * MB, 0.1, 0.1), (99 * MB, 0.1, 0.1))
    bounds = ordered_bounds(profile, compute_seconds=0.4, comm_seconds=3.0)
    assert bounds.any_schedule >= 3.0
    assert bounds.step_barrier >= 3.0


def test_layer_times_are_scaled_to_the_measured_compute():
    profile = profile_of((80 * MB, 0.5, 0.5), (20 * MB, 0.5, 0.5))
    assert ordered_bounds(profile, 4.0, 1.0).any_schedule == pytest.approx(4.0 + 0.8)


@pytest.mark.parametrize("name", NAMES)
def test_the_planners_simulation_of_an_ideal_link_never_beats_the_bound(name):
    # The planner's simulation, on a link with no fixed cost and gradients cut fine, in
    # earliest-deadline-first order: it comes close to the bound of any schedule, and stays at
    # or above it. A bound that a real schedule beat, or a simulation that beat the bound,
    # would be wrong.
    profile = load_profile(name)
    compute, comm = profile.compute_seconds, profile.compute_seconds  # the operating point
    link = LinkModel(alpha=0.0, beta=comm / profile.gradient_bytes)
    tensors = tensor_costs(profile)
    chunk = min(1024 * 1024, profile.gradient_bytes // 256)  # fine enough for the smallest model too
    transfers = build_schedule(tensors, link, Batch(min_bytes=0, max_bytes=chunk, chunk_bytes=chunk), Ordering.TIC, Batching.FIXED)
    simulated = simulate(tensors, transfers, link)
    bounds = ordered_bounds(profile, compute, comm)
    assert bounds.any_schedule <= simulated + 1e-9
    assert simulated <= bounds.any_schedule * 1.05
    assert bounds.any_schedule <= bounds.step_barrier
