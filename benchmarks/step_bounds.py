"""How short a step can be, given the order in which a model releases and reads its gradients.

max(C, M) assumes every byte can travel while the device computes. It cannot: backpropagation
releases the first layers' gradients last, and the next forward pass reads them first. Take the
end of a step's backward pass as time 0. The gradients of layers 0..i are released from
-R_i on (R_i: the backward time of layers 0..i-1), so all their bytes S_i have crossed the link
no earlier than -R_i + S_i / rate. The layer whose transfer ends last among them is read by the
next forward pass no earlier than that, and from it the pass still has at least the forward
time of layers i.. to go. So, for every i, the next forward pass ends no earlier than
S_i / rate - R_i + (forward time of layers i..); the step is the backward pass plus that.

Two bounds follow, both from the profile's per-layer times scaled to the measured C, and a link
that moves gradient bytes at the rate comm-only measured (M over all the gradient bytes):
    any schedule      the next forward pass reads each parameter as soon as it is averaged
                      (Caramel's cross-iteration window);
    step barrier      the step ends only once every transfer has (Horovod's): the next forward
                      pass starts after the last one, no earlier than max over i of
                      S_i / rate - R_i.
Both ignore each transfer's fixed cost and any slowing of the link beside compute, so no run
should beat them by more than the spread of the measured C and M; where they are equal, no
order of transfers can gain over Horovod's, and whatever Caramel gains there comes from how the
transfers run, not from when.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.profiles import BYTES_PER_PARAMETER, Profile, layer_groups


@dataclass(frozen=True)
class OrderedBounds:
    """The shortest steps, in seconds, that the release and read order allows."""

    any_schedule: float
    step_barrier: float


def ordered_bounds(profile: Profile, compute_seconds: float, comm_seconds: float) -> OrderedBounds:
    """The bounds for `profile` with a measured compute time C and communication time M."""
    compute_scale = compute_seconds / profile.compute_seconds
    seconds_per_byte = comm_seconds / profile.gradient_bytes
    sent_bytes = 0
    released_before = forward_before = 0.0  # R_i, and the forward time of layers 0..i-1
    forward_wait = barrier_wait = 0.0
    for layer in layer_groups(profile):  # the emulated layers, each released and read as one
        sent_bytes += sum(tensor.parameters for tensor in layer) * BYTES_PER_PARAMETER
        arrived = sent_bytes * seconds_per_byte - released_before  # layers 0..i all averaged, at the earliest
        barrier_wait = max(barrier_wait, arrived)
        forward_wait = max(forward_wait, arrived - forward_before)
        released_before += sum(tensor.backward_seconds for tensor in layer) * compute_scale
        forward_before += sum(tensor.forward_seconds for tensor in layer) * compute_scale
    return OrderedBounds(
        any_schedule=max(comm_seconds, compute_seconds + forward_wait),
        step_barrier=max(comm_seconds, compute_seconds + barrier_wait),
    )
