"""kopf handlers: observe, call the pure lifecycle, read what it asks, carry out its actions.
Nothing else: every decision is the lifecycle's.

Worker pods, services and network policies are known through kopf indexes, filled from watches
before any handler runs, so a restarted operator sees every pod it created earlier and creates no
duplicates. Each unfinished job is reconciled by a daemon of its own, in passes: at once, then
whenever one of its pods changes (wakeups.py), when its status asks (a backoff's end), and every
reconcile interval; so a pod deleted, failed or started is acted on as it happens, not up to an
interval later. The state lives only in the job's status. Finished jobs leave the daemon (and
lose kopf's finalizer); one with a TTL gets another that sleeps until it is due. The job's pods
and objects are owned by it: the garbage collector deletes them with it.

The log has a line per change of a job (each Event posted), and kopf's own lines only where
something failed (__main__ filters the rest). The probes: see health.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf
import pydantic
import urllib3
from kubernetes.client.exceptions import ApiException

from caramel.contract.api import GROUP, VERSION, CaramelJob, CaramelJobStatus
from caramel.contract.jobfile import describe_validation_error
from caramel_operator import metrics
from caramel_operator.builders import JOB_LABEL
from caramel_operator.cluster import Cluster, ReadForbidden, scrape
from caramel_operator.config import OperatorSettings
from caramel_operator.crd import PLURAL
from caramel_operator.gang_placement import Outcome, Unreadable, place
from caramel_operator.gang_schedulers import ObservedGroup
from caramel_operator.health import Lag, Listed, WatchCheck, serve
from caramel_operator.lifecycle import (
    FINISHED,
    CreateGroup,
    CreateObject,
    CreatePods,
    DeleteGroup,
    DeletePods,
    Observed,
    Pass,
    PlaceGang,
    Read,
    ReadGroup,
    ReadProgress,
    decide,
    due,
    expires_at,
    reject_invalid,
    report_creation_failures,
    status_from,
)
from caramel_operator.observe import WorkerObservation, observe_pod
from caramel_operator.progress import read_progress
from caramel_operator.wakeups import Wakeups

SETTINGS = OperatorSettings.from_env()
LOG = logging.getLogger("caramel_operator")
# Who posts the Events (`kubectl describe`'s "From"): the operator, and which pod of it (a pod's
# hostname is its name).
COMPONENT = "caramel-operator"
JOBS = (GROUP, VERSION, PLURAL)
FINALIZER = f"{GROUP}/finalizer"
CRD_NAME = f"{PLURAL}.{GROUP}"
WORKERS = {JOB_LABEL: kopf.PRESENT}
# Watches that silently stall are a known kopf failure mode: bound every stream.
WATCH_SERVER_TIMEOUT_SECONDS = 300
WATCH_CLIENT_TIMEOUT_SECONDS = 330
# What a look at the API server for the probes can fail with: the API server's trouble, which a
# restart of the operator would not cure.
API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, TimeoutError)
# A probe answers within the kubelet's timeout (timeoutSeconds 5 in the chart and the manifests),
# however slowly the API server lists the jobs.
PROBE_LOOK_SECONDS = 4.0
# kopf's handler types (ActivityFn, IndexingFn, TimerFn, DaemonFn) list the keyword arguments kopf
# passes every handler, a namespace among them as str | None (cluster-scoped resources have
# none). They cannot say that kopf passes each index by its name, nor that CaramelJobs, pods,
# services and network policies always have a namespace; so mypy rejects registering the
# handlers below that take either, and each such registration waives arg-type alone. mypy still
# checks the handlers' bodies.


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # Progress and diff-bases in annotations: the job's status is Caramel's alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    # kopf's own requests get the timeouts of the operator's (its default is 300 s per request).
    settings.networking.request_timeout = SETTINGS.api_request_timeout_seconds
    settings.networking.connect_timeout = SETTINGS.api_connect_timeout_seconds
    settings.watching.connect_timeout = SETTINGS.api_connect_timeout_seconds
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = COMPONENT
    settings.posting.reporting_instance = socket.gethostname()
    memo.cluster = Cluster(
        connect_timeout_seconds=SETTINGS.api_connect_timeout_seconds,
        request_timeout_seconds=SETTINGS.api_request_timeout_seconds,
    )
    memo.watch = WatchCheck()
    memo.wakeups = Wakeups()
    memo.server = await serve(SETTINGS.metrics_port, metrics.REGISTRY, lambda: _unready(memo))
    LOG.info(
        f"serving CaramelJobs in {', '.join(SETTINGS.watch_namespaces) or 'every namespace'}; API requests time out "
        f"after {SETTINGS.api_request_timeout_seconds:g} s (connect {SETTINGS.api_connect_timeout_seconds:g} s); "
        f"liveness fails when the watch misses a change for {SETTINGS.watch_stall_seconds:g} s"
    )


@kopf.on.cleanup()
async def stop_serving(memo: kopf.Memo, **_: Any) -> None:
    await memo.server.cleanup()


@kopf.on.event(*JOBS)
def note_delivery(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Each version of each job the watch delivers, and its deletion, for the probes (health.py)."""
    metadata = event["object"]["metadata"]
    if event["type"] == "DELETED":
        memo.watch.deleted(metadata["uid"])
    else:
        memo.watch.delivered(metadata["uid"], metadata["resourceVersion"])


async def _look(memo: kopf.Memo) -> Lag:
    """The watch's lag behind the API server, now (raises API_ERRORS where it cannot be reached)."""
    jobs = await asyncio.wait_for(memo.cluster.jobs(SETTINGS.watch_namespaces), PROBE_LOOK_SECONDS)
    listed = {
        job["metadata"]["uid"]: Listed(f"{job['metadata']['namespace']}/{job['metadata']['name']}", job["metadata"]["resourceVersion"])
        for job in jobs
    }
    return memo.watch.look(listed, time.monotonic())


@kopf.on.probe(id="watch")
async def watch_delivers_the_jobs(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Liveness: fails when the watch has not delivered a job's change for too long."""
    try:
        lag = await _look(memo)
    except API_ERRORS as error:
        return {"apiServer": f"unreachable: {error}"}
    if lag.seconds > SETTINGS.watch_stall_seconds:
        message = (
            f"the watch has not delivered the latest change of CaramelJob {lag.job} for {lag.seconds:.0f} s "
            f"(CARAMEL_WATCH_STALL_SECONDS {SETTINGS.watch_stall_seconds:.0f}): failing liveness, for a restart"
        )
        LOG.error(message)
        raise kopf.PermanentError(message)
    return {"behindSeconds": round(lag.seconds, 1)}


async def _unready(memo: kopf.Memo) -> str | None:
    """Why the operator is not ready (the readiness endpoint), or None."""
    try:
        await _look(memo)
    except API_ERRORS as error:
        return f"cannot reach the Kubernetes API server: {error}"
    return None if memo.watch.caught_up else "the watch has not yet delivered every CaramelJob"


@kopf.index("pods", labels=WORKERS)  # type: ignore[arg-type]  # kopf's handler types (above)
def worker_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[tuple[str, str], WorkerObservation]:
    observation = observe_pod(dict(body))
    return {(namespace, observation.job): observation} if observation else {}


@kopf.index("services", labels=WORKERS)  # type: ignore[arg-type]  # kopf's handler types (above)
def job_services(namespace: str, labels: kopf.Labels, **_: Any) -> dict[tuple[str, str], str]:
    return {(namespace, labels[JOB_LABEL]): "Service"}


@kopf.index("networking.k8s.io", "networkpolicies", labels=WORKERS)  # type: ignore[arg-type]  # kopf's handler types (above)
def job_network_policies(namespace: str, labels: kopf.Labels, **_: Any) -> dict[tuple[str, str], str]:
    return {(namespace, labels[JOB_LABEL]): "NetworkPolicy"}


def unfinished(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in FINISHED


def finished_with_ttl(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    return not unfinished(status) and (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished") is not None


@kopf.on.event("pods", labels=WORKERS)  # type: ignore[arg-type]  # kopf's handler types (above)
async def wake_the_job(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A worker pod changed: its job's next pass comes now, not at the reconcile interval. kopf
    indexes each event before it calls the handlers, so that pass sees the change."""
    memo.wakeups.wake((namespace, labels[JOB_LABEL]))


# A pass under way when its job is deleted or the operator stops runs to its end (each of its
# requests has a timeout), or is cancelled after this long.
PASS_EXIT_SECONDS = 5.0


@kopf.daemon(*JOBS, when=unfinished, cancellation_backoff=PASS_EXIT_SECONDS, cancellation_timeout=1.0)  # type: ignore[arg-type]  # kopf's handler types (above)
async def reconcile(
    body: kopf.Body,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    worker_pods: kopf.Index,
    job_services: kopf.Index,
    job_network_policies: kopf.Index,
    **_: Any,
) -> None:
    """Pass over the job until it finishes: at once, then whenever one of its pods changes, when
    its status asks (`due`: a backoff ends), and every reconcile interval.

    Each pass starts from the status the pass before wrote, not from the body's: a pod's change
    can call the next pass before the watch has delivered that write, and the operator is the
    status's only writer. The body gives the spec, always as last delivered."""
    wake = memo.wakeups.register((namespace, name))
    if not (body.get("status") or {}).get("phase"):
        # The first pass over a job. (kopf's on.create fired twice for one job once its CRD
        # was watched too: it is no count of jobs.)
        metrics.JOBS_CREATED.inc()
    status = status_from(body.get("status"))
    try:
        while not stopped:
            wake.clear()
            status = await _reconcile_once(body, status, name, namespace, memo, worker_pods, job_services, job_network_policies)
            if status.phase in FINISHED:
                return
            await _rest(wake, stopped, _pause(status))
    finally:
        memo.wakeups.forget((namespace, name), wake)


async def _reconcile_once(
    body: kopf.Body,
    status: CaramelJobStatus,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    worker_pods: kopf.Index,
    job_services: kopf.Index,
    job_network_policies: kopf.Index,
) -> CaramelJobStatus:
    """One pass: observe, decide (with what the lifecycle asks to be read), write the status, carry
    out the actions. The status written.

    The status goes first: what it records (a placement, a restart's new gang) is then on record
    before any pod it concerns is created or deleted, and a pass cut short after it (the operator
    stopped) leaves the next pass to carry out the rest, which it decides again from that status
    and the pods. The API server's refusals of creations are written after them."""
    with metrics.RECONCILE_DURATION.time():
        now = datetime.now(UTC)
        try:
            job = CaramelJob.model_validate({key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")})
        except pydantic.ValidationError as error:
            decision = reject_invalid(status, "; ".join(describe_validation_error(error)), now)
            status = await _write_status(decision.status, status, namespace, name, memo.cluster)
        else:
            workers = list(worker_pods.get((namespace, name), []))
            key = (namespace, name)
            existing = frozenset([*job_services.get(key, []), *job_network_policies.get(key, [])])
            decision = await _decide(Observed(job, status, workers, existing, now, SETTINGS), memo)
            status = await _write_status(decision.status, status, namespace, name, memo.cluster)
            refusals = await _carry_out(decision, body, namespace, memo.cluster)
            if refusals is None:
                return status  # nothing was done, and its events ("created ...") would not be true
            decision = report_creation_failures(decision, refusals)
            status = await _write_status(decision.status, status, namespace, name, memo.cluster)
        for event in decision.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
            level = logging.WARNING if event.type == "Warning" else logging.INFO
            LOG.log(level, f"CaramelJob {namespace}/{name}: {event.reason}: {event.message.splitlines()[0]}")
        for phase in decision.transitions:
            metrics.count_transition(phase)
        return status


async def _write_status(
    new: CaramelJobStatus, old: CaramelJobStatus, namespace: str, name: str, cluster: Cluster
) -> CaramelJobStatus:
    """Write the job's status where it differs from the one last written; the status written."""
    written = new.model_dump(mode="json", by_alias=True)
    if written != old.model_dump(mode="json", by_alias=True):
        await cluster.write_job_status(namespace, name, written)
    return new


def _pause(status: CaramelJobStatus) -> float:
    """Seconds to the next pass unless a pod's change calls it sooner: the reconcile interval, or
    less where the status asks for a pass sooner."""
    now = datetime.now(UTC)
    moment = due(status, now)
    interval = SETTINGS.reconcile_interval_seconds
    return interval if moment is None else min(interval, (moment - now).total_seconds())


async def _rest(wake: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Until the job's wake-up is set, its daemon is stopped, or `seconds` have passed."""
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _decide(seen: Observed, memo: kopf.Memo) -> Pass:
    """The pass `decide` makes of what the handler observed, given what it asks to be read: each
    kind of read is made once, and `decide` called again with what was read."""
    decision = decide(seen)
    done: set[type[Read]] = set()
    while asked := [read for read in decision.reads if type(read) not in done]:
        for read in asked:
            seen = await _read(read, seen, memo)
        done |= {type(read) for read in asked}
        decision = decide(seen)
    return decision


async def _read(read: Read, seen: Observed, memo: kopf.Memo) -> Observed:
    """What the lifecycle asked to be read, read into what the pass observes. A read that finds
    nothing (rank 0's metrics not served) leaves it as it was."""
    cluster: Cluster = memo.cluster
    match read:
        case ReadGroup(resource, name, gang):
            found = await cluster.group(resource, seen.job.metadata.namespace, name)
            if found is None and not await cluster.serves(resource):
                return replace(seen, group=ObservedGroup(gang, served=False))
            return replace(seen, group=ObservedGroup(gang, found))
        case PlaceGang(worker_pod, min_workers, replicas):
            outcome: Outcome
            try:
                nodes, pods = await cluster.nodes_and_pods()
            except ReadForbidden as error:
                outcome = Unreadable(str(error))
            else:
                outcome = place(seen.job, worker_pod, nodes, pods, SETTINGS.rack_label, min_workers, replicas)
            return replace(seen, placement=outcome)
        case ReadProgress(pod_ip, port):
            text = await scrape(pod_ip, port)
            if text is None:
                return seen
            reading = read_progress(text, memo.get("step_totals"), seen.now)
            memo["step_totals"] = reading.totals
            return replace(seen, progress=reading.progress, tuning=reading.tuning)
    return seen


async def _carry_out(decision: Pass, body: kopf.Body, namespace: str, cluster: Cluster) -> list[str] | None:
    """Carry out the actions; the API server's refusals of creations, or None if the job is gone
    and nothing was done."""
    creates = any(isinstance(action, CreateObject | CreatePods | CreateGroup) for action in decision.actions)
    if creates and await cluster.job_uid(namespace, body.metadata.name) != body.metadata.uid:
        # The job (or its CRD) is gone, though its daemon has not heard yet: creating pods now
        # would make orphans, which the garbage collector deletes and the next pass re-creates.
        return None
    refusals = []
    for action in decision.actions:
        match action:
            case CreateObject(manifest):
                kopf.adopt(manifest, owner=body)
                refusals += await cluster.create_object(manifest)
            case CreatePods(manifests):
                kopf.adopt(manifests, owner=body)
                refusals += await cluster.create_pods(manifests)
            case CreateGroup(resource, manifest):
                kopf.adopt(manifest, owner=body)
                refusals += await cluster.create_group(resource, manifest)
            case DeletePods(names, force):
                await cluster.delete_pods(namespace, names, force=force)
            case DeleteGroup(resource, name):
                await cluster.delete_group(resource, namespace, name)
    return refusals


# The deletion's own watch event stops the daemon, often before the deletion's answer comes back:
# kopf gives it this long to return instead of cancelling it (a WARNING each time), and removes
# its finalizer only then, so this is also how long the deletion may take.
EXPIRE_EXIT_SECONDS = 3.0


@kopf.daemon(*JOBS, when=finished_with_ttl, cancellation_backoff=EXPIRE_EXIT_SECONDS, cancellation_timeout=1.0)  # type: ignore[arg-type]  # kopf's handler types (above)
async def expire(
    body: kopf.Body, name: str, namespace: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """Delete a finished job when spec.runPolicy.ttlSecondsAfterFinished has passed."""
    # Read raw: a job that failed with InvalidSpec expires too.
    due = expires_at(body.spec.get("runPolicy", {}).get("ttlSecondsAfterFinished"), status_from(body.get("status")))
    if due is not None and not await stopped.wait(max(0.0, (due - datetime.now(UTC)).total_seconds())):
        await memo.cluster.delete_job(namespace, name)
        LOG.info(f"CaramelJob {namespace}/{name}: Expired: deleted, spec.runPolicy.ttlSecondsAfterFinished after it finished")


# How often the jobs of a CRD being deleted are looked at again, until none is left or the CRD is gone.
RELEASE_AGAIN_SECONDS = 0.5


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", field="metadata.name", value=CRD_NAME)
async def release_jobs_of_a_deleted_crd(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Deleting the CRD deletes every job, and each waits on kopf's finalizer; kopf stops serving
    a resource whose CRD is going, so the finalizers are removed here, or the CRD stays Terminating.

    Removed until the last job is gone, not once per event of the CRD: kopf serves the jobs for a
    moment longer and puts its finalizer back on a job it sees changed, and the CRD may send no
    further event before its jobs are gone (none comes from the deletion of the jobs it waits on)."""
    crd = event["object"]
    if event["type"] == "DELETED":
        memo.watch.crd_deleted()
        return
    if not (crd.get("metadata") or {}).get("deletionTimestamp"):
        return
    while jobs := await memo.cluster.jobs(SETTINGS.watch_namespaces):
        # Read after the listing: while this CRD exists no other can, so every job listed is its.
        if await memo.cluster.crd_uid(CRD_NAME) != crd["metadata"]["uid"]:
            return
        released = sum([await memo.cluster.release_job(job, FINALIZER) for job in jobs])
        if released:
            LOG.info(f"CRD {CRD_NAME} is being deleted: released {released} CaramelJobs from the operator's finalizer")
        await asyncio.sleep(RELEASE_AGAIN_SECONDS)
