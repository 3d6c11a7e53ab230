"""Time-aware transfer schedules: the order and grouping of one iteration's gradient transfers.

A gradient exists once backpropagation reaches its layer (its release time) and is needed by
the next forward pass when that pass reaches the layer (its deadline). Deadlines follow the
forward order, so sending the released piece with the earliest deadline first (TicTac's order,
earliest-deadline-first) is optimal for one link when transfers can be cut into chunks, which
lets an urgent small gradient overtake the rest of a large one. Small gradients are batched,
because every transfer pays the link's fixed cost alpha, but only with gradients needed at
about the same time: bytes needed late in the next forward pass, carried along with the first
layers' gradients, would hold up the very layers the pass starts with.

`build_schedule` turns predicted layer times and a link model into a static sequence of
transfers; `simulate` predicts the step time of a schedule, with the next forward pass waiting
for each parameter only where it reads it; `best_schedule` searches the batching parameters
for the lowest predicted step (in the spirit of MG-WFBP), and takes the fewest transfers among
the plans predicted about as fast. Everything is a pure function of data all ranks share, so
every rank derives the same schedule.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from caramel.contract.api import Scheduling
from caramel.planner.linkmodel import LinkModel
from caramel.planner.policy import Batching, Ordering, PlanningPolicy
from caramel.planner.transfers import Piece, Transfer

KiB = 1024
MiB = 1024 * KiB
# Candidate sizes for the planner's search: powers of four from 64 KiB to 256 MiB, kept within
# the job's minBucketBytes..maxBucketBytes.
CANDIDATE_SIZES = [64 * KiB * 4**power for power in range(7)]
# Chunk sizes that would cut the gradients into more pieces than this are not searched: such
# plans pay alpha thousands of times a step, and simulating them is what makes a search slow.
MAX_PIECES = 512
# Candidate deadline spans for the planner's search, as fractions of the forward pass.
CANDIDATE_SPANS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, math.inf)
# The bucket size of the first plan, made before anything was measured.
INITIAL_BUCKET_BYTES = 25 * MiB
# Iterations simulated to reach the steady state (the first has no waits).
SIMULATED_ITERATIONS = 4
# Where the steps left are unknown (a custom loop that gave no total), a new plan must repay its
# re-trace within this many steps.
PAYBACK_STEPS = 500
# Plans predicted within this share of the fastest count as equally fast, and the one with the
# fewest transfers among them is chosen. The simulation counts a transfer's fixed cost on the
# link (alpha) but not the CPU it costs every rank (Horovod's negotiation, Gloo's ring steps, the
# copies), which grows with the number of transfers. Where the CPU binds, that stretches the step;
# and 2% is about the spread of repeated measurements, so a smaller predicted gain is not worth
# more transfers (figures: benchmarks/results/2026-11-27-figures-from-code-comments.txt).
PREDICTION_TOLERANCE = 0.02
# A tensor sent in chunks is joined again once its last chunk arrives: a copy of the whole
# gradient (TensorFlow's concat, on one core; the rate below is what it was measured at:
# benchmarks/results/2026-11-27-figures-from-code-comments.txt), during which the next forward pass cannot read the parameter. The simulation counts that delay; the second
# buffer of the tensor's size alive meanwhile is not weighed.
JOIN_SECONDS_PER_BYTE = 2e-10
# Re-planning may take at most this share of the training time: its probes and its decision are
# collectives every rank waits for, at a boundary the step's time includes. On a step of a few
# milliseconds, a re-plan every replanIntervalSteps would take a tenth of it.
REPLAN_BUDGET = 0.02
# A plan searched for at one boundary is adopted at the first boundary this many steps later,
# on every rank, so that the search never stalls a step.
PLAN_LAG_STEPS = 1


@dataclass(frozen=True)
class TensorCost:
    """One parameter tensor, in forward order: its gradient's size and its layer's compute times."""

    nbytes: int
    item_size: int
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0


@dataclass(frozen=True)
class Batch:
    """How gradients are grouped: no transfer starts below `min_bytes` while more gradients are
    still to come in the iteration; none exceeds `max_bytes` unless it is one whole tensor;
    tensors are cut into chunks of at most `chunk_bytes`; the pieces of one transfer are needed
    by the next forward pass within `deadline_span_seconds` of each other."""

    min_bytes: int
    max_bytes: int
    chunk_bytes: int
    deadline_span_seconds: float = math.inf


@dataclass(frozen=True)
class Plan:
    transfers: tuple[Transfer, ...]
    batch: Batch
    predicted_step_seconds: float


def release_times(tensors: Sequence[TensorCost]) -> list[float]:
    """When each gradient exists, from the start of an undelayed iteration."""
    forward = sum(t.forward_seconds for t in tensors)
    released = [0.0] * len(tensors)
    elapsed = forward
    for index in reversed(range(len(tensors))):
        elapsed += tensors[index].backward_seconds
        released[index] = elapsed
    return released


def deadlines(tensors: Sequence[TensorCost]) -> list[float]:
    """When the next forward pass reads each parameter, from the start of that pass."""
    started = [0.0] * len(tensors)
    elapsed = 0.0
    for index, tensor in enumerate(tensors):
        started[index] = elapsed
        elapsed += tensor.forward_seconds
    return started


def _pieces(tensors: Sequence[TensorCost], chunk_bytes: int, batching: Batching) -> list[Piece]:
    pieces = []
    for index, tensor in enumerate(tensors):
        count = tensor.nbytes // tensor.item_size
        step = count if batching is Batching.OFF else max(1, chunk_bytes // tensor.item_size)
        for start in range(0, max(count, 1), max(step, 1)):
            pieces.append(Piece(index, start, min(count, start + step)))
    return pieces


def build_schedule(
    tensors: Sequence[TensorCost], link: LinkModel, batch: Batch, ordering: Ordering, batching: Batching
) -> tuple[Transfer, ...]:
    """The static sequence of one iteration's transfers, by simulated earliest-deadline-first."""
    released = release_times(tensors)
    needed = deadlines(tensors)
    item = [t.item_size for t in tensors]

    def urgency(piece: Piece) -> tuple[int, int]:
        # Deadlines follow forward order; arrival order is Horovod's, last layer first.
        return (-piece.tensor if ordering is Ordering.ARRIVAL else piece.tensor, piece.start)

    upcoming = sorted(_pieces(tensors, batch.chunk_bytes, batching), key=lambda p: (released[p.tensor], urgency(p)))
    size = {piece: (piece.stop - piece.start) * item[piece.tensor] for piece in upcoming}
    ready: list[tuple[tuple[int, int], Piece]] = []
    ready_bytes = 0
    transfers: list[Transfer] = []
    clock = 0.0
    position = 0
    while position < len(upcoming) or ready:
        while position < len(upcoming) and released[upcoming[position].tensor] <= clock:
            heapq.heappush(ready, (urgency(upcoming[position]), upcoming[position]))
            ready_bytes += size[upcoming[position]]
            position += 1
        more_to_come = position < len(upcoming)
        if not ready or (more_to_come and batching is not Batching.OFF and ready_bytes < batch.min_bytes):
            clock = released[upcoming[position].tensor]
            continue
        bucket: list[Piece] = []
        nbytes = 0
        while ready:
            piece = ready[0][1]
            if bucket and (
                batching is Batching.OFF
                or nbytes + size[piece] > batch.max_bytes
                or abs(needed[piece.tensor] - needed[bucket[0].tensor]) > batch.deadline_span_seconds
            ):
                break
            heapq.heappop(ready)
            bucket.append(piece)
            nbytes += size[piece]
        ready_bytes -= nbytes
        transfers.append(Transfer(tuple(bucket), nbytes))
        clock += link.seconds(nbytes)
    return tuple(transfers)


def simulate(tensors: Sequence[TensorCost], transfers: Sequence[Transfer], link: LinkModel, steps_per_execution: int | None = None) -> float:
    """Predicted step time: the link runs the schedule, the next forward pass waits for each
    parameter's update (and the join of a chunked one) only where it reads it. With
    `steps_per_execution`, the mean step of an execution of that many steps in one graph, which
    starts with every parameter updated and ends once its last update has landed: the execution
    boundary, where no step overlaps the transfers of the one before, is paid once per
    execution. Without it, the steady state of steps that never meet such a boundary."""
    pieces_left = [0] * len(tensors)
    for transfer in transfers:
        for piece in transfer.pieces:
            pieces_left[piece.tensor] += 1
    join_seconds = [JOIN_SECONDS_PER_BYTE * tensor.nbytes if pieces > 1 else 0.0 for tensor, pieces in zip(tensors, pieces_left)]
    updated = [0.0] * len(tensors)
    clock = link_free = 0.0
    backward_ends = []
    for _ in range(steps_per_execution or SIMULATED_ITERATIONS):
        for index, tensor in enumerate(tensors):
            clock = max(clock, updated[index]) + tensor.forward_seconds
        released = [0.0] * len(tensors)
        for index in reversed(range(len(tensors))):
            clock += tensors[index].backward_seconds
            released[index] = clock
        backward_ends.append(clock)
        left = list(pieces_left)
        for transfer in transfers:
            start = max([link_free] + [released[p.tensor] for p in transfer.pieces])
            link_free = start + link.seconds(transfer.nbytes)
            for piece in transfer.pieces:
                left[piece.tensor] -= 1
                if left[piece.tensor] == 0:
                    updated[piece.tensor] = link_free + join_seconds[piece.tensor]
    if steps_per_execution:
        return max([clock, *updated]) / steps_per_execution
    return backward_ends[-1] - backward_ends[-2]


def repays_retrace(gain_seconds_per_step: float, retrace_seconds: float | None, steps_left: int | None) -> bool:
    """Whether a plan that saves this much per step repays the re-trace that adopting it costs
    within the steps left (PAYBACK_STEPS where unknown); True while no re-trace was measured."""
    if retrace_seconds is None:
        return True
    return gain_seconds_per_step * (PAYBACK_STEPS if steps_left is None else steps_left) > retrace_seconds


def replan_interval(interval_steps: int, replan_seconds: float, seconds_per_step: float | None) -> int:
    """Steps from one re-plan to the next: `interval_steps`, or more where a re-plan, as measured,
    would take more than REPLAN_BUDGET of the steps between."""
    if not seconds_per_step:
        return interval_steps
    return max(interval_steps, math.ceil(replan_seconds / (REPLAN_BUDGET * seconds_per_step)))


def own_way_transfers(tensors: Sequence[TensorCost], link: LinkModel, fusion_bytes: int) -> tuple[Transfer, ...]:
    """The backend's own way, as the planner can predict it: each gradient sent once it exists, in
    backpropagation's order, what is ready when the link frees fused up to `fusion_bytes`
    (Horovod's fusion buffer, the tensorflow backend's buckets), no tensor cut."""
    whole = max((tensor.nbytes for tensor in tensors), default=1)
    return build_schedule(tensors, link, Batch(min_bytes=0, max_bytes=fusion_bytes, chunk_bytes=whole), Ordering.ARRIVAL, Batching.FIXED)


def initial_plan(tensors: Sequence[TensorCost], scheduling: Scheduling) -> Plan:
    """The plan before anything was measured: Horovod's order (backpropagation's, last tensor
    first) in buckets of up to INITIAL_BUCKET_BYTES (PyTorch DDP's default), within the job's
    bucket bounds. Without release times an earliest-deadline-first plan would hold every
    transfer back until the first layer's gradient, the last to exist."""
    size = min(scheduling.max_bucket_bytes, max(scheduling.min_bucket_bytes, INITIAL_BUCKET_BYTES))
    batch = Batch(min_bytes=0, max_bytes=size, chunk_bytes=size)
    unmeasured = [TensorCost(t.nbytes, t.item_size) for t in tensors]
    transfers = build_schedule(unmeasured, LinkModel(alpha=0.0, beta=0.0), batch, Ordering.ARRIVAL, Batching.FIXED)
    return Plan(transfers, batch, math.nan)


def candidate_batches(tensors: Sequence[TensorCost], scheduling: Scheduling, batching: Batching = Batching.AUTO) -> list[Batch]:
    low, high = scheduling.min_bucket_bytes, scheduling.max_bucket_bytes
    sizes = sorted({min(high, max(low, size)) for size in CANDIDATE_SIZES})
    few_enough = [size for size in sizes if sum(-(-t.nbytes // size) for t in tensors) <= MAX_PIECES]
    sizes = few_enough or sizes[-1:]
    if batching is not Batching.AUTO:
        return [Batch(min_bytes=0, max_bytes=high, chunk_bytes=high)]
    forward = sum(tensor.forward_seconds for tensor in tensors)
    spans = sorted({fraction * forward for fraction in CANDIDATE_SPANS}) if forward > 0 else [math.inf]
    # Each bucket size also whole: a tensor larger than the bucket then travels alone and unjoined.
    largest = max(tensor.nbytes for tensor in tensors)
    return [
        Batch(min_bytes=min_bytes, max_bytes=max_bytes, chunk_bytes=chunk_bytes, deadline_span_seconds=span)
        for max_bytes in sizes
        for chunk_bytes in dict.fromkeys([max_bytes, max(max_bytes, largest)])
        for min_bytes in [0, *(size for size in sizes if size <= max_bytes)]
        for span in spans
    ]


def best_schedule(
    tensors: Sequence[TensorCost],
    link: LinkModel,
    scheduling: Scheduling,
    steps_per_execution: int | None = None,
    policy: PlanningPolicy = PlanningPolicy(),
) -> Plan:
    """Among the candidate batchings' schedules predicted (`simulate`, for executions of
    `steps_per_execution` steps where given) within PREDICTION_TOLERANCE of the fastest, the one
    with the fewest transfers (the fastest of those; the first candidate of equals, so every
    rank picks the same), ordered and batched as `policy` says."""
    plans = []
    for batch in candidate_batches(tensors, scheduling, policy.batching):
        transfers = build_schedule(tensors, link, batch, policy.ordering, policy.batching)
        plans.append(Plan(transfers, batch, simulate(tensors, transfers, link, steps_per_execution)))
    fastest = min(plan.predicted_step_seconds for plan in plans)
    good_enough = [plan for plan in plans if plan.predicted_step_seconds <= fastest * (1 + PREDICTION_TOLERANCE) + 1e-9]
    return min(good_enough, key=lambda plan: (len(plan.transfers), plan.predicted_step_seconds))
