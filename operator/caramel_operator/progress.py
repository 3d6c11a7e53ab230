"""Training progress from rank 0's Prometheus metrics, for the job's status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from caramel.contract.api import TrainingProgress, Tuning
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
from caramel_operator.lifecycle import timestamp


@dataclass(frozen=True)
class StepTotals:
    """The step-time histogram's running sum and count: two scrapes give the mean step in between."""

    seconds: float
    steps: float


@dataclass(frozen=True)
class Scrape:
    progress: TrainingProgress
    tuning: Tuning | None
    totals: StepTotals | None


def read_progress(metrics_text: str, previous: StepTotals | None, now: datetime) -> Scrape:
    """Rank 0's progress from its /metrics text; previous is the last scrape's step totals."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.labels.get(RANK_LABEL, "0") == "0":
                samples[sample.name] = sample.value
    totals = None
    step_seconds = None
    if f"{STEP_DURATION}_count" in samples:
        totals = StepTotals(samples[f"{STEP_DURATION}_sum"], samples[f"{STEP_DURATION}_count"])
        base = previous if previous and previous.steps < totals.steps else StepTotals(0.0, 0.0)
        if totals.steps > base.steps:
            step_seconds = (totals.seconds - base.seconds) / (totals.steps - base.steps)
    bandwidth = samples.get(BANDWIDTH)
    progress = TrainingProgress(
        step=int(samples.get(GLOBAL_STEP, 0)),
        step_seconds=round(step_seconds, 6) if step_seconds is not None else None,
        bandwidth_bytes_per_second=bandwidth,
        bandwidth=human_bandwidth(bandwidth) if bandwidth else "",
        loss=samples.get(LOSS),
        checkpoint_step=int(samples[CHECKPOINT_STEP]) if CHECKPOINT_STEP in samples else None,
        elastic=bool(samples.get(ELASTIC)),
        update_time=timestamp(now),
    )
    bucket = samples.get(BUCKET_BYTES)
    tuning = None
    if bucket:
        beta = samples.get(LINK_BETA)
        tuning = Tuning(bucket_bytes=int(bucket), alpha_seconds=samples.get(LINK_ALPHA), beta_seconds_per_byte=beta or None)
    return Scrape(progress, tuning, totals)


def human_bandwidth(bytes_per_second: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.1f} {unit}"
    return f"{bytes_per_second:.0f} B/s"
