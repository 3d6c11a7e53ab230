"""The operator's own Prometheus metrics (named like MPIJob's `mpi_operator_jobs_*_total`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from caramel.contract.api import Phase

REGISTRY = CollectorRegistry()

JOBS_CREATED = Counter("caramel_operator_jobs_created", "CaramelJobs seen created.", registry=REGISTRY)
JOBS_SUCCEEDED = Counter("caramel_operator_jobs_succeeded", "CaramelJobs that succeeded.", registry=REGISTRY)
JOBS_FAILED = Counter("caramel_operator_jobs_failed", "CaramelJobs that failed.", registry=REGISTRY)
JOBS_RESTARTED = Counter(
    "caramel_operator_jobs_restarted", "Whole-gang restarts: after a failure, or to resize the gang (spec.workers.minReplicas).", registry=REGISTRY
)
RECONCILE_DURATION = Histogram(
    "caramel_operator_reconcile_duration_seconds",
    "Time to reconcile one CaramelJob: observe, decide (reading what the decision asks), act.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30),
    registry=REGISTRY,
)

TRANSITION_COUNTERS = {Phase.SUCCEEDED: JOBS_SUCCEEDED, Phase.FAILED: JOBS_FAILED, Phase.RESTARTING: JOBS_RESTARTED}


def count_transition(phase: Phase) -> None:
    counter = TRANSITION_COUNTERS.get(phase)
    if counter is not None:
        counter.inc()
