"""Rank 0's training figures while the gang runs: asked for (ReadProgress), and, scraped, copied
into the status; its tuning kept for the gangs after it."""

from __future__ import annotations

from caramel.contract.api import Phase
from caramel_operator.lifecycle.actions import ReadProgress
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass
from caramel_operator.observe import WorkerState


def follow_progress(seen: Observed, p: Pass) -> None:
    """While the gang runs (as this pass leaves it), ask for rank 0's figures, or copy them in once read."""
    if p.status.phase is not Phase.RUNNING or not seen.job.spec.metrics.enabled:
        return
    rank0 = next(
        (w for w in seen.workers if w.index == 0 and w.gang == p.status.gang and w.state is WorkerState.RUNNING), None
    )
    if rank0 is None or not rank0.pod_ip:
        return
    if seen.progress is None:
        p.reads.append(ReadProgress(rank0.pod_ip, seen.job.spec.metrics.port))
    else:
        p.update(progress=seen.progress, tuning=seen.tuning or p.status.tuning)
