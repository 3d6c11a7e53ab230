"""The gang lifecycle as a pure state machine on status.phase.

`decide` takes a job, its last status and what its pods look like now, and returns the new
status and the actions that move the cluster towards it. It does no I/O, so every transition
is unit-tested; the kopf handlers only observe, call `decide`, and carry out the actions.

    Pending --all workers running--> Running --all succeeded--> Succeeded
       |  \\                           |
       |   `--worker failed--> Restarting (backoff, new gang) --> Running ...
       |                               `--backoff limit reached--> Failed
       `--suspend--> Suspended --resume--> Pending
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from caramel.job.api import (
    CaramelJob,
    CaramelJobStatus,
    CleanPodPolicy,
    Condition,
    ConditionType,
    Phase,
    WorkerCounts,
    WorkerFailure,
)
from caramel.job.contract import worker_name
from caramel_operator.builders import build_service, build_worker_pod
from caramel_operator.config import OperatorSettings
from caramel_operator.observe import NODE_LOST_REASONS, WorkerObservation, WorkerState

FINISHED = {Phase.SUCCEEDED, Phase.FAILED}


@dataclass(frozen=True)
class CreateService:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class CreatePods:
    manifests: list[dict[str, Any]]


@dataclass(frozen=True)
class DeletePods:
    names: list[str]
    force: bool = False
    """Delete without a grace period: for pods whose node is gone, which would never finish terminating."""


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished has passed."""


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


Action = CreateService | CreatePods | DeletePods | DeleteJob


@dataclass
class Decision:
    status: CaramelJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    transitions: list[Phase] = field(default_factory=list)
    """Phases entered, for the operator's counters."""


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def status_from(raw: dict[str, Any] | None) -> CaramelJobStatus:
    """The job's status as last written, ignoring what other writers keep there."""
    raw = raw or {}
    known = {
        key: value
        for key, value in raw.items()
        if key in CaramelJobStatus.model_fields or key in {f.alias for f in CaramelJobStatus.model_fields.values()}
    }
    return CaramelJobStatus.model_validate(known)


def with_condition(
    status: CaramelJobStatus, kind: ConditionType, holds: bool, reason: str, message: str, now: datetime
) -> CaramelJobStatus:
    """The status with one condition set; its transition time moves only when it flips."""
    value = "True" if holds else "False"
    previous = next((c for c in status.conditions if c.type is kind), None)
    if previous is None and not holds:
        return status
    since = previous.last_transition_time if previous and previous.status == value else timestamp(now)
    condition = Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=since)
    others = [c for c in status.conditions if c.type is not kind]
    order = list(ConditionType)
    return status.model_copy(update={"conditions": sorted([*others, condition], key=lambda c: order.index(c.type))})


def reject_invalid(status: CaramelJobStatus, problems: str, now: datetime) -> Decision:
    """A spec the schema let through but Caramel cannot run: Failed, nothing created."""
    if status.phase is Phase.FAILED:
        return Decision(status)
    message = f"invalid spec: {problems}"
    failed = with_condition(status, ConditionType.FAILED, True, "InvalidSpec", message, now)
    failed = failed.model_copy(update={"phase": Phase.FAILED, "message": message, "completion_time": timestamp(now)})
    return Decision(failed, events=[Event("Warning", "InvalidSpec", message)], transitions=[Phase.FAILED])


def decide(
    job: CaramelJob,
    status: CaramelJobStatus,
    workers: list[WorkerObservation],
    service_exists: bool,
    now: datetime,
    settings: OperatorSettings,
) -> Decision:
    return _Reconciliation(job, status, workers, service_exists, now, settings).run()


class _Reconciliation:
    """One pass of decide(); a class only to share its inputs between the steps."""

    def __init__(self, job, status, workers, service_exists, now, settings) -> None:
        self.job: CaramelJob = job
        self.replicas = job.spec.workers.replicas
        self.workers: list[WorkerObservation] = workers
        self.service_exists: bool = service_exists
        self.now: datetime = now
        self.settings: OperatorSettings = settings
        self.decision = Decision(status)

    @property
    def status(self) -> CaramelJobStatus:
        return self.decision.status

    def update(self, **changes: Any) -> None:
        self.decision.status = self.status.model_copy(update=changes)

    def condition(self, kind: ConditionType, holds: bool, reason: str, message: str = "") -> None:
        self.decision.status = with_condition(self.status, kind, holds, reason, message, self.now)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.decision.events.append(Event(kind, reason, message))

    def enter(self, phase: Phase) -> None:
        self.update(phase=phase)
        self.decision.transitions.append(phase)

    # -- the steps -------------------------------------------------------------------------

    def run(self) -> Decision:
        if self.status.phase in FINISHED:
            self.finished()
        elif self.job.spec.run_policy.suspend:
            self.suspend()
        else:
            self.active()
        self.count_workers()
        return self.decision

    def finished(self) -> None:
        self.clean_up_pods()
        ttl = self.job.spec.run_policy.ttl_seconds_after_finished
        if ttl is not None and self.status.completion_time:
            if self.now >= parse_timestamp(self.status.completion_time) + timedelta(seconds=ttl):
                self.decision.actions.append(DeleteJob())

    def suspend(self) -> None:
        self.delete([w for w in self.workers if not w.terminating])
        if self.status.phase is not Phase.SUSPENDED:
            self.enter(Phase.SUSPENDED)
            self.update(message="suspended: spec.runPolicy.suspend is true")
            self.condition(ConditionType.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true; pods deleted")
            self.condition(ConditionType.RUNNING, False, "Suspended")
            self.event("Normal", "Suspended", f"deleted {len(self.workers)} worker pods; the job waits")

    def active(self) -> None:
        if self.status.phase is Phase.SUSPENDED:
            self.enter(Phase.PENDING)
            # A new gang number: pods of the suspended gang may still be terminating.
            self.update(gang=self.status.gang + 1, message="")
            self.condition(ConditionType.SUSPENDED, False, "Resumed", "spec.runPolicy.suspend is false")
            self.event("Normal", "Resumed", "creating the worker gang again")
        if self.deadline_passed():
            return
        if not self.service_exists:
            self.decision.actions.append(CreateService(build_service(self.job)))
        stale = [w for w in self.workers if w.gang != self.status.gang]
        self.delete([w for w in stale if not w.terminating])
        current = {w.index: w for w in self.workers if w.gang == self.status.gang}
        if self.status.phase is Phase.RESTARTING and (stale or self.now < parse_timestamp(self.status.restart_after)):
            return  # the backoff runs, or the failed gang is still going away
        if self.worker_failed(current):
            return
        if len(current) < self.replicas:
            if not stale:  # stale pods hold the names the new ones need
                self.create_gang(current)
            return
        self.progress_phase(current)

    def deadline_passed(self) -> bool:
        deadline = self.job.spec.run_policy.active_deadline_seconds
        if deadline and self.status.start_time:
            if self.now >= parse_timestamp(self.status.start_time) + timedelta(seconds=deadline):
                self.fail("DeadlineExceeded", f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({deadline} s)")
                return True
        return False

    def worker_failed(self, current: dict[int, WorkerObservation]) -> bool:
        failure = self.first_failure(current)
        if failure is None:
            return False
        what = f"worker {failure.worker} failed: {failure.reason}" + (
            f", exit code {failure.exit_code}" if failure.exit_code is not None else ""
        )
        self.update(last_failure=failure)
        limit = self.job.spec.run_policy.backoff_limit
        if self.status.restarts >= limit:
            self.fail("BackoffLimitExceeded", f"{what}; spec.runPolicy.backoffLimit ({limit}) reached")
            return True
        backoff = self.settings.restart_backoff(self.status.restarts)
        self.enter(Phase.RESTARTING)
        self.update(
            restarts=self.status.restarts + 1,
            gang=self.status.gang + 1,
            restart_after=timestamp(self.now + timedelta(seconds=backoff)),
        )
        message = f"{what}; restarting the whole gang ({self.status.restarts} of {limit}) in {backoff:.0f} s"
        self.update(message=message)
        self.condition(ConditionType.RESTARTING, True, "WorkerFailed", message)
        self.condition(ConditionType.RUNNING, False, "WorkerFailed", what)
        self.event("Warning", "WorkerFailed", message)
        self.delete([w for w in current.values() if not w.terminating])
        return True

    def first_failure(self, current: dict[int, WorkerObservation]) -> WorkerFailure | None:
        for index in range(self.replicas):
            worker = current.get(index)
            if worker is None:
                # Gone after the gang ran: deleted by someone, or garbage-collected with its node.
                if self.status.phase is Phase.RUNNING:
                    return WorkerFailure(worker=worker_name(self.job, index), reason="PodDeleted")
                continue
            if worker.state is WorkerState.FAILED:
                return WorkerFailure(
                    worker=worker.name, reason=worker.failure_reason, exit_code=worker.exit_code, message=worker.failure_message
                )
            if worker.terminating:
                return WorkerFailure(worker=worker.name, reason="PodDeleted", message="deleted while the job was running")
        return None

    def create_gang(self, current: dict[int, WorkerObservation]) -> None:
        missing = [index for index in range(self.replicas) if index not in current]
        pods = [
            build_worker_pod(
                self.job, index, default_image=self.settings.runtime_image, gang=self.status.gang, tuning=self.status.tuning
            )
            for index in missing
        ]
        self.decision.actions.append(CreatePods(pods))
        if not current:
            message = f"created {len(pods)} worker pods (gang {self.status.gang})"
            self.condition(ConditionType.CREATED, True, "GangCreated", message)
            self.event("Normal", "GangCreated", message)

    def progress_phase(self, current: dict[int, WorkerObservation]) -> None:
        states = [worker.state for worker in current.values()]
        if all(state is WorkerState.SUCCEEDED for state in states):
            self.enter(Phase.SUCCEEDED)
            self.update(completion_time=timestamp(self.now), message="")
            self.condition(ConditionType.SUCCEEDED, True, "AllWorkersSucceeded", "every worker finished")
            self.condition(ConditionType.RUNNING, False, "AllWorkersSucceeded")
            self.condition(ConditionType.RESTARTING, False, "AllWorkersSucceeded")
            self.event("Normal", "Succeeded", "every worker finished")
            self.clean_up_pods()
        elif all(state in (WorkerState.RUNNING, WorkerState.SUCCEEDED) for state in states):
            if self.status.phase is not Phase.RUNNING:
                self.enter(Phase.RUNNING)
                self.update(start_time=self.status.start_time or timestamp(self.now), message="")
                self.condition(ConditionType.RUNNING, True, "AllWorkersRunning", f"{self.replicas} workers running")
                self.condition(ConditionType.RESTARTING, False, "AllWorkersRunning")
                self.event("Normal", "Running", f"all {self.replicas} workers running")
        else:
            self.explain_pending(current)

    def explain_pending(self, current: dict[int, WorkerObservation]) -> None:
        """Say why the gang waits: the first worker with a known cause, in status and an Event."""
        blocked = [w for w in current.values() if w.state is WorkerState.PENDING and w.pending_reason]
        if not blocked:
            return
        worker = min(blocked, key=lambda w: w.index)
        others = f" (and {len(blocked) - 1} more workers)" if len(blocked) > 1 else ""
        message = f"{worker.name} is pending{others}: {worker.pending_reason}: {worker.pending_message}"
        if message != self.status.message:
            self.update(message=message)
            self.event("Warning", worker.pending_reason, message)

    def fail(self, reason: str, message: str) -> None:
        self.enter(Phase.FAILED)
        self.update(completion_time=timestamp(self.now), message=message)
        self.condition(ConditionType.FAILED, True, reason, message)
        self.condition(ConditionType.RUNNING, False, reason)
        self.condition(ConditionType.RESTARTING, False, reason)
        self.event("Warning", reason, message)
        self.clean_up_pods()

    def clean_up_pods(self) -> None:
        """Apply spec.runPolicy.cleanPodPolicy to a finished job's pods."""
        policy = self.job.spec.run_policy.clean_pod_policy
        if policy is CleanPodPolicy.NONE:
            return
        finished = {WorkerState.SUCCEEDED, WorkerState.FAILED}
        self.delete(
            [w for w in self.workers if not w.terminating and (policy is CleanPodPolicy.ALL or w.state not in finished)]
        )

    def delete(self, workers: list[WorkerObservation]) -> None:
        if not workers:
            return
        lost = [w.name for w in workers if w.failure_reason in NODE_LOST_REASONS]
        others = [w.name for w in workers if w.failure_reason not in NODE_LOST_REASONS]
        if lost:
            self.decision.actions.append(DeletePods(lost, force=True))
        if others:
            self.decision.actions.append(DeletePods(others))

    def count_workers(self) -> None:
        current = [w for w in self.workers if w.gang == self.status.gang and not w.terminating]
        counts = WorkerCounts(
            total=self.replicas,
            pending=sum(w.state is WorkerState.PENDING for w in current),
            running=sum(w.state is WorkerState.RUNNING for w in current),
            succeeded=sum(w.state is WorkerState.SUCCEEDED for w in current),
            failed=sum(w.state is WorkerState.FAILED for w in current),
        )
        self.update(workers=counts, ready_workers=f"{counts.running}/{self.replicas}")
