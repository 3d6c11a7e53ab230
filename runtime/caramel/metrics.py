"""Per-iteration Prometheus metrics of one training process.

Every series carries a `rank` label, so that one Prometheus job can scrape all ranks of all
workers. The registry is the process's own: it holds exactly the series documented here.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# The series the operator reads from rank 0 are named in the contract.
from caramel.contract.telemetry import (
    BANDWIDTH,
    BUCKET_BYTES,
    CHECKPOINT_STEP,
    ELASTIC,
    GLOBAL_STEP,
    LINK_ALPHA,
    LINK_BETA,
    LOSS,
    RANK_LABEL,
    STEP_DURATION,
)
from caramel.planner.timing import StepTimes

# Step times from a millisecond (a tiny model) to a minute (a large model on a slow link).
STEP_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class PlanRecord:
    """The transfer plan in force and the link model as last measured."""

    bucket_bytes: int
    alpha_seconds: float
    beta_seconds_per_byte: float
    plan_changes: int
    planned: bool
    """Whether the steps run the plan (True) or Horovod's own way, as the selector measured."""


class WorkerMetrics:
    """The metrics of one rank."""

    def __init__(self, rank: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()

        def metric(kind, name, documentation, **kwargs):
            return kind(name, documentation, [RANK_LABEL], registry=self.registry, **kwargs).labels(str(rank))

        self.step_duration = metric(Histogram, STEP_DURATION, "Wall time of a training step.", buckets=STEP_SECONDS_BUCKETS)
        self.compute = metric(Counter, "caramel_compute_seconds", "Step time not spent waiting for communication.")
        self.communication = metric(Counter, "caramel_communication_seconds", "Time the gradient collectives took.")
        self.exposed = metric(
            Counter, "caramel_exposed_communication_seconds", "Time training waited for communication (not overlapped)."
        )
        self.overlap = metric(
            Gauge, "caramel_overlap_ratio", "Share of the last step's communication hidden behind computation (0 to 1)."
        )
        self.transfer_wait = metric(
            Counter, "caramel_transfer_wait_seconds", "Time transfers waited for their gradients; divide by transfers."
        )
        self.transfers_total = metric(Counter, "caramel_transfers", "Gradient transfers (collectives) done.")
        self.communicated = metric(Counter, "caramel_communicated_bytes", "Gradient bytes allreduced.")
        self.bandwidth = metric(
            Gauge, BANDWIDTH, "Gradient bytes allreduced per second of communication in the last step (algorithm bandwidth)."
        )
        self.steps = metric(Counter, "caramel_steps", "Training steps completed by this process.")
        self.global_step = metric(Gauge, GLOBAL_STEP, "Training step reached, counting restored steps.")
        self.loss = metric(Gauge, LOSS, "Training loss of the last step on this rank.")
        # The operator restarts a gang that found room to grow right after a checkpoint: the
        # restart then loses the fewest steps.
        self.checkpoint_step = metric(Gauge, CHECKPOINT_STEP, "Step of the latest checkpoint written or restored (0: none).")
        self.bucket_bytes = metric(Gauge, BUCKET_BYTES, "Largest gradient transfer the plan in force allows.")
        self.transfers = metric(Gauge, "caramel_batching_transfers", "Gradient transfers per step in the plan in force.")
        self.plan_changes = metric(Counter, "caramel_plan_changes", "Re-plans that changed the transfer schedule.")
        self.alpha = metric(Gauge, LINK_ALPHA, "Fitted fixed cost of one transfer (alpha).")
        self.beta = metric(Gauge, LINK_BETA, "Fitted inverse bandwidth (beta).")
        self.elastic = metric(Gauge, ELASTIC, "1 once this rank's gang trains elastic (hvd.elastic): a lost worker is replaced, not the gang restarted.")
        self.planned = metric(Gauge, "caramel_planned", "1 while the steps run the plan, 0 while they run Horovod's own way (measured faster).")
        self._plan_changes_seen = 0

    def serve(self, port: int) -> None:
        """Serve /metrics on every interface, in a daemon thread."""
        start_http_server(port, registry=self.registry)

    def record_step(self, step: int, step_seconds: float, loss: float, times: StepTimes | None = None) -> None:
        """One step: its wall time and loss, and what its stamps said of its communication
        (None for a step that communicated eagerly, with nothing stamped)."""
        exposed = times.exposed_seconds if times else 0.0
        self.step_duration.observe(step_seconds)
        self.compute.inc(max(0.0, step_seconds - exposed))
        self.steps.inc()
        self.global_step.set(step)
        self.loss.set(loss)
        if times is None:
            return
        self.communication.inc(times.communication_seconds)
        self.exposed.inc(exposed)
        if times.communication_seconds > 0:
            hidden = times.communication_seconds - min(exposed, times.communication_seconds)
            self.overlap.set(hidden / times.communication_seconds)
            self.bandwidth.set(times.nbytes / times.communication_seconds)
        self.transfer_wait.inc(times.transfer_wait_seconds)
        self.transfers_total.inc(len(times.transfers))
        self.communicated.inc(times.nbytes)
        self.transfers.set(len(times.transfers))

    def record_elastic(self) -> None:
        """The gang trains elastic from now on (rank 0 says so once: `caramel.contract.elastic`)."""
        self.elastic.set(1)

    def record_plan(self, plan: PlanRecord) -> None:
        self.bucket_bytes.set(plan.bucket_bytes)
        self.alpha.set(plan.alpha_seconds)
        self.beta.set(plan.beta_seconds_per_byte)
        self.planned.set(int(plan.planned))
        self.plan_changes.inc(plan.plan_changes - self._plan_changes_seen)
        self._plan_changes_seen = plan.plan_changes
