"""What one pass of the lifecycle sees: the job, its status, its pods and objects, the time, and
what the handler read because an earlier run of the pass asked for it (actions.Read)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from caramel.contract.api import CaramelJob, CaramelJobStatus, TrainingProgress, Tuning
from caramel.contract.restart import RestartPolicy
from caramel_operator.builders import build_worker_pod
from caramel_operator.config import OperatorSettings
from caramel_operator.gang_placement import Outcome
from caramel_operator.gang_schedulers import GangScheduler, ObservedGroup, gang_scheduler
from caramel_operator.observe import WorkerObservation


@dataclass(frozen=True)
class Observed:
    job: CaramelJob
    status: CaramelJobStatus
    """The status the pass before wrote: where this pass starts."""
    workers: list[WorkerObservation]
    """The job's worker pods, of every gang."""
    existing: frozenset[str]
    """The kinds of the job's own objects that exist (Service, NetworkPolicy)."""
    now: datetime
    settings: OperatorSettings
    group: ObservedGroup | None = None
    """The group object of the gang waiting for its gang scheduler's admission (actions.ReadGroup)."""
    placement: Outcome | None = None
    """R-Storm's outcome for the placement, or the look for room, the pass asked for (actions.PlaceGang)."""
    progress: TrainingProgress | None = None
    """Rank 0's figures, scraped while the gang runs (actions.ReadProgress)."""
    tuning: Tuning | None = None
    """Rank 0's tuning as scraped with its figures, for the gangs after it."""

    @cached_property
    def scheduler(self) -> GangScheduler:
        return gang_scheduler(self.job)

    @cached_property
    def policy(self) -> RestartPolicy:
        """The job's restart policy, with the operator's backoff."""
        return RestartPolicy.of(self.job, self.settings.restart_backoff_seconds, self.settings.restart_backoff_max_seconds)

    @property
    def replicas(self) -> int:
        return self.job.spec.workers.replicas

    @property
    def min_workers(self) -> int:
        return self.job.spec.workers.min_workers

    def worker_pod(self, worker_index: int, **given: Any) -> dict[str, Any]:
        """Worker pod `worker_index` of the job (build_worker_pod's keywords `given`), with what the
        operator's settings give every worker: the default image (the GPU one for a job that asks
        for GPUs) and, for GPU jobs, the GPU nodes' tolerations."""
        return build_worker_pod(
            self.job, worker_index, default_image=self.settings.default_image(self.job), gpu_tolerations=self.settings.gpu_tolerations, **given
        )
