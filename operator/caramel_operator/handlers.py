"""kopf handlers: observe, call the pure lifecycle, carry out its actions. Nothing else.

Worker pods and services are known through kopf indexes, filled from watches before any
handler runs, so a restarted operator sees every pod it created earlier and creates no
duplicates. Each job is reconciled by a timer; the state lives only in the job's status.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf
import pydantic
from prometheus_client import start_http_server

from caramel.job.api import GROUP, VERSION, CaramelJob, Phase
from caramel.job.jobfile import describe_validation_error
from caramel_operator import metrics
from caramel_operator.builders import JOB_LABEL
from caramel_operator.cluster import Cluster, scrape
from caramel_operator.config import OperatorSettings
from caramel_operator.crd import PLURAL
from caramel_operator.lifecycle import CreatePods, CreateService, Decision, DeleteJob, DeletePods, decide, reject_invalid, status_from
from caramel_operator.observe import WorkerObservation, WorkerState, observe_pod
from caramel_operator.progress import read_progress

SETTINGS = OperatorSettings.from_env()
JOBS = (GROUP, VERSION, PLURAL)
WORKERS = {JOB_LABEL: kopf.PRESENT}
# Watches that silently stall are a known kopf failure mode: bound every stream.
WATCH_SERVER_TIMEOUT_SECONDS = 300
WATCH_CLIENT_TIMEOUT_SECONDS = 330


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Progress and diff-bases in annotations: the job's status is Caramel's alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.posting.level = logging.WARNING
    memo.cluster = Cluster()
    start_http_server(SETTINGS.metrics_port, registry=metrics.REGISTRY)


@kopf.index("pods", labels=WORKERS)
def worker_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[tuple[str, str], WorkerObservation]:
    observation = observe_pod(dict(body))
    return {(namespace, observation.job): observation} if observation else {}


@kopf.index("services", labels=WORKERS)
def job_services(namespace: str, labels: kopf.Labels, **_: Any) -> dict[tuple[str, str], bool]:
    return {(namespace, labels[JOB_LABEL]): True}


@kopf.on.create(*JOBS)
def count_created(**_: Any) -> None:
    metrics.JOBS_CREATED.inc()


@kopf.timer(*JOBS, interval=SETTINGS.reconcile_interval_seconds)
async def reconcile(
    body: kopf.Body,
    name: str,
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    worker_pods: kopf.Index,
    job_services: kopf.Index,
    **_: Any,
) -> None:
    with metrics.RECONCILE_DURATION.time():
        now = datetime.now(UTC)
        status = status_from(body.get("status"))
        try:
            job = CaramelJob.model_validate({key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")})
        except pydantic.ValidationError as error:
            decision = reject_invalid(status, "; ".join(describe_validation_error(error)), now)
        else:
            workers = list(worker_pods.get((namespace, name), []))
            decision = decide(job, status, workers, (namespace, name) in job_services, now, SETTINGS)
            await _carry_out(decision, body, memo.cluster)
            await _read_progress(decision, job, workers, memo, now)
        for event in decision.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        for phase in decision.transitions:
            metrics.count_transition(phase)
        patch.status.update(decision.status.model_dump(mode="json", by_alias=True))


async def _carry_out(decision: Decision, body: kopf.Body, cluster: Cluster) -> None:
    for action in decision.actions:
        match action:
            case CreateService(manifest):
                kopf.adopt(manifest, owner=body)
                await cluster.create_service(manifest)
            case CreatePods(manifests):
                kopf.adopt(manifests, owner=body)
                await cluster.create_pods(manifests)
            case DeletePods(names, force):
                await cluster.delete_pods(body.metadata.namespace, names, force=force)
            case DeleteJob():
                await cluster.delete_job(body.metadata.namespace, body.metadata.name)


async def _read_progress(
    decision: Decision, job: CaramelJob, workers: list[WorkerObservation], memo: kopf.Memo, now: datetime
) -> None:
    """Copy rank 0's figures into the status while the gang runs; keep its tuning for restarts."""
    if decision.status.phase is not Phase.RUNNING or not job.spec.metrics.enabled:
        return
    rank0 = next(
        (w for w in workers if w.index == 0 and w.gang == decision.status.gang and w.state is WorkerState.RUNNING), None
    )
    if rank0 is None or not rank0.pod_ip:
        return
    text = await scrape(rank0.pod_ip, job.spec.metrics.port)
    if text is None:
        return
    reading = read_progress(text, memo.get("step_totals"), now)
    memo["step_totals"] = reading.totals
    decision.status = decision.status.model_copy(
        update={"progress": reading.progress, "tuning": reading.tuning or decision.status.tuning}
    )


@kopf.on.delete(*JOBS)
async def clean_up(name: str, namespace: str, memo: kopf.Memo, worker_pods: kopf.Index, **_: Any) -> None:
    """Delete the job's pods and service now, rather than leave them to the garbage collector."""
    names = [worker.name for worker in worker_pods.get((namespace, name), [])]
    await memo.cluster.delete_pods(namespace, names)
    await memo.cluster.delete_service(namespace, name)
