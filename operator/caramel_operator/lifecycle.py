"""The gang lifecycle as a pure state machine on status.phase.

`decide` takes a job, its last status and what its pods look like now, and returns the new
status and the actions that move the cluster towards it. It does no I/O, so every transition
is unit-tested; the kopf handlers only observe, call `decide`, and carry out the actions.

    Pending --all workers running--> Running --all succeeded--> Succeeded
       |  \\                           |
       |   `--worker failed--> Restarting (backoff, new gang) --> Running ...
       |                               `--backoff limit reached--> Failed
       `--suspend--> Suspended --resume--> Pending

Every gang is placed before any of its pods exists: with R-Storm, `decide` asks for a placement
(`PlaceGang`), the handler reads the cluster, and `with_placement` writes the outcome into the
status and runs the pass again from it, which creates the pods from the recorded placement: one
pass places and creates the gang. So every pod of a gang, even one re-created after an operator
restart, follows the same placement and gets the same topology.

A restart after a worker failed of itself waits a backoff that doubles at each such restart; one
after a worker was lost (observe.LOST_REASONS: its pod deleted or evicted, its node gone) starts
the new gang at once, as soon as the old pods are gone. Both count against backoffLimit. `due`
says when the status next asks for a pass (a backoff's end), so that the handler comes back then.
A gang whose every failed worker says its script raised before rank 0's first step is not
restarted: the job fails at once with reason ScriptError, quoting the error (the restart policy's
`fails_at_once`), unless spec.runPolicy.restartOnScriptError.

A gang may run with fewer workers than spec.workers.replicas, never fewer than minReplicas
(status.size). Each gang starts with at least `least` workers, set when the gang before it
ended: all of them for a new or resumed job; as many as the gang before after a failure (R-Storm
places more where they fit; the scheduler, which cannot tell before, is asked for all of them);
the survivors after workers were lost with their pods or nodes; the scheduled ones when the rest
stayed unschedulable for the gang scheduling timeout (that restart is a resize: no backoff, not
counted against backoffLimit). R-Storm places the most workers that fit, from `least` up, and
once a gang has found no room for the gang scheduling timeout, from minReplicas up. While a gang
R-Storm placed runs short, the operator looks for room every gang scheduling timeout; room found,
the gang restarts with the larger size after rank 0's next checkpoint (another resize).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from caramel.contract.api import (
    CaramelJob,
    CaramelJobStatus,
    CleanPodPolicy,
    Condition,
    ConditionType,
    GangPlacement,
    GangSize,
    Phase,
    PlacedBy,
    PlacementPolicy,
    TrainingProgress,
    WorkerCounts,
    WorkerFailure,
)
from caramel.contract.env import worker_name
from caramel.contract.restart import NOT_RESTARTED, SCRIPT_ERROR, RestartPolicy
from caramel.contract.termination import fit, script_raised
from caramel_operator.builders import build_network_policy, build_service, build_worker_pod, worker_pod_problems
from caramel_operator.config import OperatorSettings
from caramel_operator.gang_placement import NoRoom, Outcome, Placed, Unreadable, placed_by, placed_topology, placement_problems
from caramel_operator.gang_schedulers import GroupResource, ObservedGroup, gang_scheduler, group_name
from caramel_operator.observe import INVALID_IMAGE, LOST_REASONS, NODE_LOST_REASONS, POD_DELETED, WorkerObservation, WorkerState

FINISHED = {Phase.SUCCEEDED, Phase.FAILED}
# kopf cuts longer Event messages in the middle; the restart Event fits its own lines to it.
EVENT_MESSAGE_BYTES = 1024
# status.pendingReason (and the Event's reason) of a gang whose gang scheduler has yet to admit it.
WAITING_FOR_ADMISSION = "WaitingForAdmission"
# Sorts failures whose time is not known (which come first anyway) beside those whose time is.
NO_TIME = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class CreateObject:
    """One of the job's own objects besides its pods: its headless Service, its NetworkPolicy."""

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
class CreateGroup:
    """Create the group object a gang scheduler admits the gang by (a Volcano PodGroup), owned by the job."""

    resource: GroupResource
    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeleteGroup:
    """Delete the group object of a gang that is gone: its scheduler would go on counting it."""

    resource: GroupResource
    name: str


@dataclass(frozen=True)
class PlaceGang:
    """Read the cluster's nodes and pods and place the current gang with R-Storm (the handler's
    I/O; `record_placement` records the outcome)."""

    worker_pod: dict[str, Any]
    """Worker 0's pod as built: its requests, tolerations and node selection bind the placement."""

    fewest: int
    """Place at least this many workers, or none."""

    most: int
    """Place at most this many: as many as fit up to here."""

    growing: bool = False
    """A look for room for a gang that runs short: what fits is room to grow, not the gang's placement."""


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


Action = CreateObject | CreatePods | DeletePods | PlaceGang | CreateGroup | DeleteGroup


@dataclass
class Decision:
    status: CaramelJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    transitions: list[Phase] = field(default_factory=list)
    """Phases entered, for the operator's counters."""


def restart_policy(job: CaramelJob, settings: OperatorSettings) -> RestartPolicy:
    """The job's restart policy, with the operator's backoff."""
    return RestartPolicy.of(job, settings.restart_backoff_seconds, settings.restart_backoff_max_seconds)


def how_it_ended(failure: WorkerFailure) -> str:
    """A failed worker's reason, with its exit code where it exited: "Error, exit code 137"."""
    return failure.reason if failure.exit_code is None else f"{failure.reason}, exit code {failure.exit_code}"


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


def expires_at(ttl: int | None, status: CaramelJobStatus) -> datetime | None:
    """When a finished job is due for deletion (ttl: spec.runPolicy.ttlSecondsAfterFinished), if ever."""
    if not isinstance(ttl, int) or ttl < 0 or status.phase not in FINISHED or not status.completion_time:
        return None
    return parse_timestamp(status.completion_time) + timedelta(seconds=ttl)


def report_creation_failures(decision: Decision, failures: list[str], now: datetime) -> Decision:
    """What the API server refused (Pod Security, quota, admission webhooks, RBAC), in the status
    and, when it changes, in a Warning event: otherwise only the operator's log would know."""
    if not failures:
        return decision
    more = f" (and {len(failures) - 1} more refusals)" if len(failures) > 1 else ""
    message = f"cannot create the job's objects: {failures[0]}{more}"
    if message != decision.status.message:
        decision.events.append(Event("Warning", "FailedCreate", message))
    decision.status = decision.status.model_copy(update={"message": message})
    return decision


def record_placement(decision: Decision, job: CaramelJob, outcome: Outcome, now: datetime, settings: OperatorSettings) -> Decision:
    """The outcome of R-Storm's placement of the current gang, in the status (and Events).

    A placement found is recorded for the pass to create the pods from (`with_placement`); nodes
    given more CPU than they have free are named, since their workers wait for CPU. When no
    placement fits, or RStorm was asked for but the operator may not read the nodes, nothing is
    created: the reason goes into status.message and a Warning Event, and placement is tried again
    after the restart backoff (10 s, 20 s, ...). Auto, where the nodes cannot be read (namespaced
    RBAC), leaves the gang to the scheduler. For a look for room while the gang runs
    (PlaceGang.growing), what fits is room to grow (`record_room`).
    """
    request = next(action for action in decision.actions if isinstance(action, PlaceGang))
    if request.growing:
        return record_room(decision, job, outcome)
    status = decision.status
    events = decision.events
    if isinstance(outcome, Placed):
        placement = GangPlacement(gang=status.gang, by=PlacedBy.RSTORM, workers=list(outcome.workers), cpu_short=list(outcome.cpu_short))
        nodes = {worker.node for worker in outcome.workers}
        racks = {worker.rack for worker in outcome.workers}
        events.append(
            Event("Normal", "Placed", f"R-Storm placed {len(outcome.workers)} workers on {len(nodes)} nodes in {len(racks)} racks (status.placement)")
        )
        message = ""
        if outcome.cpu_short:
            message = (
                f"placed with too little free CPU on {', '.join(outcome.cpu_short)} (CPU is a soft constraint of "
                "R-Storm): the workers there wait until CPU frees up"
            )
            events.append(Event("Warning", "PlacedCpuShort", message))
        decision.status = status.model_copy(update={"placement": placement, "message": message})
        return decision
    if isinstance(outcome, Unreadable) and job.spec.placement.policy is PlacementPolicy.AUTO:
        message = f"R-Storm cannot read the cluster ({outcome.message}): the scheduler places the gang"
        events.append(Event("Warning", "PlacementUnavailable", message))
        placement = GangPlacement(gang=status.gang, by=PlacedBy.SCHEDULER, message=message)
        decision.status = status.model_copy(update={"placement": placement})
        return decision
    previous = status.placement if status.placement and status.placement.gang == status.gang else None
    attempts = (previous.attempts if previous else 0) + 1
    waiting_since = previous.waiting_since if previous and previous.waiting_since else timestamp(now)
    backoff = restart_policy(job, settings).backoff(attempts - 1)
    if isinstance(outcome, NoRoom):
        why = outcome.message
    else:
        why = f"R-Storm placement (spec.placement.policy RStorm) needs to list nodes and pods cluster-wide: {outcome.message}"
    message = f"cannot place the gang: {why}; trying again in {backoff:.0f} s"
    placement = GangPlacement(
        gang=status.gang,
        by=PlacedBy.RSTORM,
        attempts=attempts,
        retry_after=timestamp(now + timedelta(seconds=backoff)),
        waiting_since=waiting_since,
    )
    events.append(Event("Warning", "Unplaceable", message))
    decision.status = status.model_copy(update={"placement": placement, "message": message})
    return decision


def record_room(decision: Decision, job: CaramelJob, outcome: Outcome) -> Decision:
    """Room found for more workers of a gang that runs short: it restarts with them after rank 0's
    next checkpoint (the lifecycle's `grow_at_checkpoint`). No room, or no right to look: the gang
    runs on as it is, quietly, and looks again later. Nor is room short of CPU room to grow into:
    the new workers would wait for it, and the gang would shrink again after the timeout."""
    size = decision.status.size
    if not isinstance(outcome, Placed) or outcome.cpu_short or size is None:
        return decision
    progress = decision.status.progress
    grow_to = len(outcome.workers)
    decision.events.append(
        Event(
            "Normal",
            "RoomToGrow",
            f"room for {grow_to} of {job.spec.workers.replicas} workers: the gang of {size.replicas} restarts with them "
            "after its next checkpoint",
        )
    )
    after = (progress.checkpoint_step or 0) if progress else 0
    decision.status = decision.status.model_copy(
        update={"size": size.model_copy(update={"grow_to": grow_to, "grow_after_step": after})}
    )
    return decision


def with_placement(
    decision: Decision,
    job: CaramelJob,
    outcome: Outcome,
    workers: list[WorkerObservation],
    existing: frozenset[str],
    now: datetime,
    settings: OperatorSettings,
    group: ObservedGroup | None = None,
) -> Decision:
    """A pass that asked for a placement (`PlaceGang`), given R-Storm's outcome: the outcome
    recorded (`record_placement`), and the pass run again from that status, on the same
    observations, which creates the gang's pods where a placement was found (or the gang left to
    the scheduler). So one pass places and creates a gang: a pass of its own for the placement
    cost a reconcile interval. The second run's actions are the first's but the request for a
    placement; the Events and phases entered of both are kept. A look for room to grow is
    recorded only: it creates nothing."""
    recorded = record_placement(decision, job, outcome, now, settings)
    if any(isinstance(action, PlaceGang) and action.growing for action in decision.actions):
        return recorded
    again = decide(job, recorded.status, workers, existing, now, settings, group)
    return Decision(again.status, again.actions, recorded.events + again.events, recorded.transitions + again.transitions)


def due(status: CaramelJobStatus, now: datetime) -> datetime | None:
    """When the status asks for a pass itself, after `now`: at the end of a restart's backoff, or
    of the wait before R-Storm tries to place the gang again. None while only the pods' changes
    (the old gang's going, say) and the reconcile interval call for passes."""
    placement = status.placement if status.placement and status.placement.gang == status.gang else None
    waits = [
        status.restart_after if status.phase is Phase.RESTARTING else None,
        placement.retry_after if placement else None,
    ]
    return min((end for end in (parse_timestamp(wait) for wait in waits if wait) if end > now), default=None)


def decide(
    job: CaramelJob,
    status: CaramelJobStatus,
    workers: list[WorkerObservation],
    existing: frozenset[str],
    now: datetime,
    settings: OperatorSettings,
    group: ObservedGroup | None = None,
) -> Decision:
    """`existing`: the kinds of the job's own objects that exist (Service, NetworkPolicy); `group`:
    the current gang's group object, for a gang scheduler that takes one (gang_schedulers.py), as
    the handler read it."""
    return _Reconciliation(job, status, workers, existing, now, settings, group).run()


class _Reconciliation:
    """One pass of decide(); a class only to share its inputs between the steps."""

    def __init__(self, job, status, workers, existing, now, settings, group) -> None:
        self.job: CaramelJob = job
        self.scheduler = gang_scheduler(job)
        self.group: ObservedGroup | None = group
        self.replicas = job.spec.workers.replicas
        self.floor = job.spec.workers.floor
        self.workers: list[WorkerObservation] = workers
        self.existing: frozenset[str] = existing
        self.now: datetime = now
        self.settings: OperatorSettings = settings
        self.policy = restart_policy(job, settings)
        self.decision = Decision(status)

    @property
    def status(self) -> CaramelJobStatus:
        return self.decision.status

    @property
    def size(self) -> GangSize:
        """The size on record; before the first gang, the whole gang's (no gang is sized yet)."""
        return self.status.size or GangSize(gang=-1, replicas=self.replicas, least=self.replicas)

    @property
    def gang_size(self) -> int | None:
        """Workers of the current gang, or None while it is not yet sized (created)."""
        size = self.status.size
        return size.replicas if size and size.gang == self.status.gang else None

    @property
    def expected(self) -> int:
        """Workers the current gang has, or will have as far as is known yet."""
        return self.gang_size or self.replicas

    @property
    def least(self) -> int:
        """The fewest workers the next gang may start with, within the spec as it is now."""
        return min(self.replicas, max(self.floor, self.size.least))

    def update(self, **changes: Any) -> None:
        self.decision.status = self.status.model_copy(update=changes)

    def update_size(self, **changes: Any) -> None:
        self.update(size=self.size.model_copy(update=changes))

    def condition(self, kind: ConditionType, holds: bool, reason: str, message: str = "") -> None:
        self.decision.status = with_condition(self.status, kind, holds, reason, message, self.now)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.decision.events.append(Event(kind, reason, message))

    def enter(self, phase: Phase) -> None:
        # A wait of the gang before is no reason to keep quiet about the next one.
        self.update(phase=phase, pending_reason="")
        self.decision.transitions.append(phase)

    def of_replicas(self, workers: int) -> str:
        return f"all {workers} workers" if workers == self.replicas else f"{workers} of {self.replicas} workers"

    # -- the steps -------------------------------------------------------------------------

    def run(self) -> Decision:
        if self.status.phase not in FINISHED:
            problems = (
                self.settings.image_problems(self.job)
                + worker_pod_problems(self.job, default_image=self.settings.default_image(self.job))
                + placement_problems(self.job)
            )
            if problems:
                # As any failure: a gang already running (the template edited since) is cleaned up.
                self.fail("InvalidSpec", f"invalid spec: {'; '.join(problems)}")
                self.count_workers()
                return self.decision
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

    def suspend(self) -> None:
        self.delete([w for w in self.workers if not w.terminating])
        if self.status.phase is not Phase.SUSPENDED:
            self.delete_group(self.status.gang)
            self.enter(Phase.SUSPENDED)
            self.update(message="suspended: spec.runPolicy.suspend is true")
            self.condition(ConditionType.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true; pods deleted")
            self.condition(ConditionType.RUNNING, False, "Suspended")
            self.event("Normal", "Suspended", f"deleted {len(self.workers)} worker pods; the job waits")

    def active(self) -> None:
        if self.status.phase is Phase.SUSPENDED:
            self.enter(Phase.PENDING)
            # A new gang number: pods of the suspended gang may still be terminating. The deadline
            # starts again, as a Kubernetes Job's does: a suspended job is not running. The
            # resumed gang asks for every worker again, as a new job's does.
            self.update(gang=self.status.gang + 1, message="", start_time=timestamp(self.now))
            self.update_size(least=self.replicas)
            self.condition(ConditionType.SUSPENDED, False, "Resumed", "spec.runPolicy.suspend is false")
            self.event("Normal", "Resumed", "creating the worker gang again")
        start_time = self.status.start_time
        if not start_time:
            # The deadline counts from here, not from when every worker runs: a gang that never
            # gets there (an image that cannot be pulled, no room) must not wait forever.
            start_time = timestamp(self.now)
            self.update(start_time=start_time)
        if self.deadline_passed(start_time):
            return
        for manifest in self.own_objects():
            if manifest["kind"] not in self.existing:
                self.decision.actions.append(CreateObject(manifest))
        stale = [w for w in self.workers if w.gang != self.status.gang]
        self.delete([w for w in stale if not w.terminating])
        current = {w.index: w for w in self.workers if w.gang == self.status.gang}
        restart_after = self.status.restart_after  # set with the phase (restart)
        if self.status.phase is Phase.RESTARTING and (stale or (restart_after and self.now < parse_timestamp(restart_after))):
            return  # the backoff runs, or the failed gang is still going away
        if self.image_invalid(current) or self.worker_failed(current) or self.gang_stuck(current):
            return
        if self.gang_size is None or len(current) < self.gang_size:
            if stale:  # stale pods hold the names the new ones need
                return
            self.create_gang(current)
            if self.gang_size is None or len(current) < self.gang_size:
                return  # else every pod was there, the gang unsized (by an operator from before sizes)
        if self.grow_at_checkpoint(current):
            return
        self.progress_phase(current)
        self.look_for_room()

    def deadline_passed(self, start_time: str) -> bool:
        running = (self.now - parse_timestamp(start_time)).total_seconds()
        if self.policy.deadline_passed(running):
            deadline = self.policy.active_deadline_seconds
            self.fail("DeadlineExceeded", f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({deadline} s)")
            return True
        return False

    def own_objects(self) -> list[dict[str, Any]]:
        objects = [build_service(self.job)]
        if self.settings.network_policy:
            objects.append(
                build_network_policy(
                    self.job,
                    monitoring_namespace=self.settings.monitoring_namespace,
                    operator_namespace=self.settings.operator_namespace,
                )
            )
        return objects

    def image_invalid(self, current: dict[int, WorkerObservation]) -> bool:
        """An image name no runtime accepts: no restart can help, so the job fails at once."""
        worker = next((w for w in current.values() if w.pending_reason == INVALID_IMAGE), None)
        if worker is None:
            return False
        self.update(last_failure=WorkerFailure(worker=worker.name, reason=INVALID_IMAGE, message=worker.pending_message))
        self.fail(INVALID_IMAGE, f"{worker.name} cannot start: {worker.pending_message} (check spec.image)")
        return True

    def gang_stuck(self, current: dict[int, WorkerObservation]) -> bool:
        """Part of the gang holds its nodes while the rest cannot be scheduled: after the timeout,
        the gang restarts with the scheduled part where spec.workers.minReplicas allows it (a
        resize), or else releases it all, so that the held resources can serve the gang as a
        whole later (or another job), and retries with backoff. A gang scheduler's admission
        (spec.runPolicy.schedulingPolicy: Kueue, Volcano) avoids this."""
        if len(current) < self.expected or self.status.phase is Phase.RUNNING:
            return False
        unschedulable = [w for w in current.values() if w.pending_reason == "Unschedulable"]
        holding = [w for w in current.values() if w.scheduled]
        created = [parse_timestamp(w.created) for w in current.values() if w.created]
        if not unschedulable or not holding or not created:
            return False
        waited = (self.now - min(created)).total_seconds()
        timeout = self.settings.gang_scheduling_timeout_seconds
        if waited < timeout:
            return False
        what = (
            f"{len(unschedulable)} of {len(current)} workers unschedulable for {waited:.0f} s "
            f"while {len(holding)} held their nodes (gang scheduling timeout {timeout:.0f} s)"
        )
        if len(holding) >= self.floor:
            why = f"{len(unschedulable)} stayed unschedulable for the gang scheduling timeout ({timeout:.0f} s)"
            self.restart(f"{what}: the gang runs with the {len(holding)} scheduled", "GangResized", least=len(holding), why=why)
            return True
        worker = min(unschedulable, key=lambda w: w.index)
        failure = WorkerFailure(worker=worker.name, reason="GangUnschedulable", message=worker.pending_message)
        self.restart(f"released the partly scheduled gang: {what}", "GangUnschedulable", failure=failure, least=self.expected)
        return True

    def worker_failed(self, current: dict[int, WorkerObservation]) -> bool:
        failures = self.failures(current)
        self.note_rejoined(current, failures)
        if not failures:
            return False
        if self.script_error(current, failures):
            return True
        if self.elastic_goes_on(current, failures):
            return False
        what = self.what_failed(failures)
        failure = failures[0]
        lost = [f for f in failures if f.reason in LOST_REASONS]
        if lost:
            # Their room went with them: the survivors fit, and R-Storm places more where they do.
            names = ", ".join(f"{f.worker} ({f.reason})" for f in lost)
            why = f"{names} {'was' if len(lost) == 1 else 'were'} lost"  # e.g. demo-worker-3 (NodeLost) was lost
            self.restart(what, "WorkerFailed", failure=failure, least=self.expected - len(lost), why=why)
            return True
        # The gang before fit. R-Storm sees whether more do now; the scheduler is asked for the
        # whole gang again, and the gang scheduling timeout shrinks it if that does not fit.
        placement = self.status.placement
        placed_by_rstorm = placement is not None and placement.gang == self.status.gang and placement.by is PlacedBy.RSTORM
        self.restart(what, "WorkerFailed", failure=failure, least=self.expected if placed_by_rstorm else self.replicas)
        return True

    def script_error(self, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> bool:
        """Whether the gang's script raised before rank 0's first step, as every failed worker
        says: the job fails at once. Or whether that may be so, and worker 0, which alone can tell
        whether rank 0 did a step, still runs: no restart for a while yet (the pass that its pod's
        change calls, or the reconcile interval's, looks again). A lost worker is no script's error."""
        raised = [None if failure.reason in LOST_REASONS else script_raised(failure.message) for failure in failures]
        if self.policy.fails_at_once(raised):
            self.update(last_failure=failures[0])
            self.fail(SCRIPT_ERROR, f"{self.what_failed(failures)}; {NOT_RESTARTED}")
            return True
        worker_0 = current.get(0)
        worker_0_runs = worker_0 is not None and worker_0.state is WorkerState.RUNNING and not worker_0.terminating
        first_failed = min((w.failed_at for w in current.values() if w.state is WorkerState.FAILED and w.failed_at), default=None)
        since = math.inf if first_failed is None else (self.now - first_failed).total_seconds()
        return self.policy.awaits_rank_0(raised, worker_0_runs, since)

    @staticmethod
    def what_failed(failures: list[WorkerFailure]) -> str:
        """The first failure, its cause, and who followed it."""
        failure, followers = failures[0], failures[1:]
        what = f"worker {failure.worker} failed: {how_it_ended(failure)}"
        if failure.cause:
            what += f": {failure.cause}"
        if followers:
            who = ", ".join(f"{follower.worker} ({how_it_ended(follower)})" for follower in followers)
            what += f"; {who} failed after it"
        return what

    def elastic_goes_on(self, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> bool:
        """Whether an elastic gang goes on without its failed workers (rank 0 said it trains
        elastic): its peers roll back to their last commit and re-form in their processes, and each
        failed worker is deleted and created again, to rejoin them at their next commit. Not where
        worker 0 failed (it serves the rendezvous), where fewer than spec.workers.minReplicas would
        remain, or where spec.runPolicy.backoffLimit is reached: those restart the whole gang."""
        progress = self.status.progress
        if self.status.phase is not Phase.RUNNING or progress is None or not progress.elastic:
            return False
        names = {worker_name(self.job, index): index for index in range(self.expected)}
        failed = [names[failure.worker] for failure in failures if failure.worker in names]
        if 0 in failed or self.expected - len(failed) < self.floor:
            return False
        new = [failure for failure in failures if self.newly_failed(failure, current.get(names[failure.worker]))]
        replaced = self.status.replaced_workers + len(new)
        if new and not self.policy.may_restart(self.status.restarts + replaced - 1):
            return False
        self.delete([current[index] for index in failed if index in current and not current[index].terminating])
        if new:
            limit = self.policy.backoff_limit
            going_on = self.of_replicas(self.expected - len(failed))
            message = (
                f"{self.what_failed(failures)}; the elastic gang goes on with {going_on} (their last commit) and "
                f"{', '.join(failure.worker for failure in new)} {'is' if len(new) == 1 else 'are'} created again to rejoin it "
                f"({self.status.restarts + replaced} of {limit}, spec.runPolicy.backoffLimit)"
            )
            replacing = [*self.status.replacing, *(f.worker for f in new if f.worker not in self.status.replacing)]
            self.update(replaced_workers=replaced, replacing=replacing, replaced_at=timestamp(self.now), last_failure=new[0], message=message)
            self.condition(ConditionType.RESIZED, True, "WorkerReplaced", message)
            self.event("Warning", "WorkerReplaced", fit([message], new[0].message.splitlines(), EVENT_MESSAGE_BYTES))
        return True

    def newly_failed(self, failure: WorkerFailure, worker: WorkerObservation | None) -> bool:
        """Whether a failure is news: not of a worker being replaced, whose old pod goes away
        meanwhile, unless it is the replacement itself that failed (created since the decision)."""
        if failure.worker not in self.status.replacing:
            return True
        replaced_at = self.status.replaced_at
        return (
            worker is not None and worker.state is WorkerState.FAILED and bool(worker.created) and replaced_at is not None
            and parse_timestamp(worker.created) >= parse_timestamp(replaced_at)
        )  # fmt: skip

    def note_rejoined(self, current: dict[int, WorkerObservation], failures: list[WorkerFailure]) -> None:
        """Workers of an elastic gang created again and running: no longer being replaced."""
        if not self.status.replacing:
            return
        failed = {failure.worker for failure in failures}
        running = {worker.name for worker in current.values() if worker.state is WorkerState.RUNNING and not worker.terminating}
        rejoined = [name for name in self.status.replacing if name in running and name not in failed]
        if not rejoined:
            return
        replacing = [name for name in self.status.replacing if name not in rejoined]
        self.update(replacing=replacing)
        if not replacing:
            message = f"{', '.join(rejoined)} running again; {self.of_replicas(len(current))} in the elastic gang"
            self.condition(ConditionType.RESIZED, False, "WorkersReplaced", message)
            self.event("Normal", "WorkersReplaced", message)

    def grow_at_checkpoint(self, current: dict[int, WorkerObservation]) -> bool:
        """A gang that found room to grow restarts once rank 0 has written a checkpoint since:
        the new gang resumes from it, losing the few steps run after it. Not a gang whose workers
        are finishing: its last checkpoint is its end."""
        size, progress = self.status.size, self.status.progress
        if self.status.phase is not Phase.RUNNING or size is None or not size.grow_to or progress is None:
            return False
        if any(worker.state is not WorkerState.RUNNING for worker in current.values()):
            return False
        step = progress.checkpoint_step or 0
        if step <= size.grow_after_step:
            return False
        what = f"room for {size.grow_to} of {self.replicas} workers, and a checkpoint at step {step}"
        self.restart(f"{what}: the gang of {size.replicas} grows", "GangResized", least=size.replicas)
        return True

    def look_for_room(self) -> None:
        """While a gang R-Storm placed runs short of spec.workers.replicas, look for room for more
        every gang scheduling timeout. It can grow only at a checkpoint, which the operator learns
        of from rank 0's metrics: jobs without spec.checkpoint or metrics grow at restarts only."""
        size, placement = self.status.size, self.status.placement
        if (
            self.status.phase is not Phase.RUNNING
            or size is None
            or size.gang != self.status.gang
            or size.replicas >= self.replicas
            or size.grow_to
            or size.next_look is None
            or self.now < parse_timestamp(size.next_look)
            or not (self.job.spec.checkpoint and self.job.spec.metrics.enabled)
            or placement is None
            or placement.gang != self.status.gang
            or placement.by is not PlacedBy.RSTORM
        ):
            return
        self.update_size(next_look=timestamp(self.now + timedelta(seconds=self.settings.gang_scheduling_timeout_seconds)))
        pod = self.worker_pod(0, gang=self.status.gang)
        self.decision.actions.append(PlaceGang(pod, fewest=size.replicas + 1, most=self.replicas, growing=True))

    def restart(
        self, what: str, reason: str, *, least: int, failure: WorkerFailure | None = None, why: str | None = None
    ) -> None:
        """Delete the whole gang and start a new one of at least `least` workers (never fewer than
        spec.workers.minReplicas); `why`, where given, is why it may have fewer than replicas.

        After a failure the restart counts against backoffLimit (or the job fails there) and
        waits the backoff, unless the worker blamed was lost (LOST_REASONS). A resize (no
        failure) does neither: nothing failed, the gang's size changes, and the new gang resumes
        from the latest checkpoint at once."""
        current = [w for w in self.workers if w.gang == self.status.gang]
        shrinking = least < self.expected
        limit = self.policy.backoff_limit
        restarts, waited, backoff = self.status.restarts, self.status.backed_off_restarts, 0.0
        if failure is not None:
            self.update(last_failure=failure)
            if not self.policy.may_restart(restarts + self.status.replaced_workers):
                self.fail("BackoffLimitExceeded", f"{what}; spec.runPolicy.backoffLimit ({limit}) reached")
                return
            restarts += 1
            if failure.reason not in LOST_REASONS:  # a crash may well crash again; a lost worker is no crash loop
                backoff = self.policy.backoff(waited)
                waited += 1
        self.enter(Phase.RESTARTING)
        self.delete_group(self.status.gang)
        self.update(
            restarts=restarts,
            backed_off_restarts=waited,
            gang=self.status.gang + 1,
            restart_after=timestamp(self.now + timedelta(seconds=backoff)),
            replacing=[],  # the new gang starts whole
        )
        self.update_size(least=max(self.floor, least), reason=self.size.reason if why is None else why)
        if failure is not None:
            when = f"in {backoff:.0f} s" if backoff else "at once"
            message = f"{what}; restarting the whole gang ({restarts + self.status.replaced_workers} of {limit}) {when}"
        else:
            message = f"{what}; restarting the whole gang from its latest checkpoint"
        self.update(message=message)
        self.condition(ConditionType.RESTARTING, True, reason, message)
        self.condition(ConditionType.RUNNING, False, reason, what)
        if failure is not None:
            # The failed pod goes with its gang: its last lines stay in the Event (the status keeps
            # only the last failure's).
            self.event("Warning", reason, fit([message], failure.message.splitlines(), EVENT_MESSAGE_BYTES))
        else:
            self.event("Warning" if shrinking else "Normal", reason, message)
        self.delete([w for w in current if not w.terminating])

    def failures(self, current: dict[int, WorkerObservation]) -> list[WorkerFailure]:
        """The current gang's failed workers, the first to fail first (`WorkerObservation.failed_at`):
        the peers of a worker that fails follow it within moments, each with its own error (a
        connection reset, a collective aborted), and the first is the cause. Workers gone with no
        time to tell (a pod deleted and gone, a lost node) come before the rest, since no peer's
        failure takes a pod away; ties go by index."""
        found: list[tuple[datetime | None, int, WorkerFailure]] = []
        for index in range(self.expected):
            worker = current.get(index)
            if worker is None:
                # Gone after the gang ran: deleted by someone, or garbage-collected with its node.
                if self.status.phase is Phase.RUNNING:
                    found.append((None, index, WorkerFailure(worker=worker_name(self.job, index), reason=POD_DELETED)))
            elif worker.state is WorkerState.FAILED:
                failure = WorkerFailure(
                    worker=worker.name,
                    reason=worker.failure_reason,
                    exit_code=worker.exit_code,
                    cause=worker.failure_cause,
                    message=worker.failure_message,
                )
                found.append((worker.failed_at, index, failure))
            elif worker.terminating:
                failure = WorkerFailure(worker=worker.name, reason=POD_DELETED, message="deleted while the job was running")
                found.append((worker.failed_at, index, failure))
        found.sort(key=lambda item: (item[0] is not None, item[0] or NO_TIME, item[1]))
        return [failure for _, _, failure in found]

    def create_gang(self, current: dict[int, WorkerObservation]) -> None:
        placement = self.placement(current)
        if placement is None:
            return
        size = len(placement.workers) or self.gang_size or self.least
        if self.gang_size is None:
            self.size_gang(size)
        if not current and not self.gang_admitted(size):
            return
        missing = [index for index in range(size) if index not in current]
        nodes: list[str | None] = [worker.node for worker in placement.workers] or [None] * size
        topology = (
            placed_topology(placement.workers, self.job.spec.workers.slots, self.settings.links)
            if placement.workers
            else None
        )
        pods = [
            self.worker_pod(
                index,
                gang=self.status.gang,
                replicas=size,
                tuning=self.status.tuning,
                node=nodes[index],
                topology=topology,
                rendezvous_timeout_seconds=self.settings.rendezvous_timeout_seconds,
            )
            for index in missing
        ]
        if pods:
            self.decision.actions.append(CreatePods(pods))
        if not current:
            message = f"created {len(pods)} worker pods (gang {self.status.gang})"
            self.condition(ConditionType.CREATED, True, "GangCreated", message)
            self.event("Normal", "GangCreated", message)

    def worker_pod(self, worker_index: int, **given: Any) -> dict[str, Any]:
        """Worker pod `worker_index` of the job (build_worker_pod's keywords `given`), with what the
        operator's settings give every worker: the default image (the GPU one for a job that asks
        for GPUs) and, for GPU jobs, the GPU nodes' tolerations."""
        return build_worker_pod(
            self.job, worker_index, default_image=self.settings.default_image(self.job), gpu_tolerations=self.settings.gpu_tolerations, **given
        )

    def gang_admitted(self, size: int) -> bool:
        """Whether the gang scheduler admitted the new gang of `size` workers, so that its pods may
        be created. A scheduler that takes a group object gets it first (owned by the job) and the
        pods wait until the group is admitted; a cluster that does not serve the group's resource
        fails the job, naming what to install. Pods of a gang already created belong to an
        admitted gang: its missing ones are created without asking again."""
        resource = self.scheduler.resource
        if resource is None:
            return True
        gang = self.status.gang
        pod = self.worker_pod(0, gang=gang, replicas=size)
        group = self.scheduler.group(self.job, gang, size, pod)
        if group is None:
            return True
        seen = self.group if self.group is not None and self.group.gang == gang else None
        if seen is None:
            return False  # not read for this gang (new in this pass): the next pass reads it
        scheduler = self.scheduler.name
        what = f"{resource.kind} {group['metadata']['name']}"
        if not seen.served:
            self.fail(
                "GangSchedulerMissing",
                f"spec.runPolicy.schedulingPolicy.gangScheduler {scheduler}: the API server does not serve {resource}; "
                f"install {self.scheduler.installed}, or choose another gang scheduler",
            )
            return False
        if seen.found is None:
            # Said nothing of yet: a refusal of the creation is what the status says (FailedCreate).
            self.decision.actions.append(CreateGroup(resource, group))
            return False
        if not self.scheduler.admitted(seen.found):
            phase = (seen.found.get("status") or {}).get("phase")
            message = f"waiting for {scheduler} to admit {what}, a gang of {size} workers" + (f" (phase {phase})" if phase else "")
            if self.status.pending_reason != WAITING_FOR_ADMISSION:  # an Event once, not at every change of phase
                self.event("Normal", WAITING_FOR_ADMISSION, message)
            self.update(message=message, pending_reason=WAITING_FOR_ADMISSION)
            return False
        return True

    def delete_group(self, gang: int) -> None:
        """Delete the group object of a gang that goes (restarted, suspended); a finished job's
        stays with it, as its pods may, and goes with it (owner reference)."""
        if self.scheduler.resource is not None:
            self.decision.actions.append(DeleteGroup(self.scheduler.resource, group_name(self.job, gang)))

    def size_gang(self, size: int) -> None:
        """Record the size of the gang being created; where it differs from the gang before, say
        so in the Resized condition and an Event."""
        before = self.size
        short = size < self.replicas
        # Every way to fewer workers gives its reason; the fallback covers a spec edited since.
        reason = (before.reason or "no room for more") if short else ""
        timeout = timedelta(seconds=self.settings.gang_scheduling_timeout_seconds)
        self.update(
            size=GangSize(
                gang=self.status.gang,
                replicas=size,
                least=size,
                reason=reason,
                next_look=timestamp(self.now + timeout) if short else None,
            )
        )
        if size == before.replicas:
            return
        message = f"running {self.of_replicas(size)}" + (f": {reason}" if short else " again")
        self.condition(ConditionType.RESIZED, short, "FewerWorkers" if short else "AllWorkers", message)
        self.event("Warning" if size < before.replicas else "Normal", "Resized", message)

    def placement(self, current: dict[int, WorkerObservation]) -> GangPlacement | None:
        """The current gang's placement; None while R-Storm is still to place it (nothing to create)."""
        gang = self.status.gang
        recorded = self.status.placement if self.status.placement and self.status.placement.gang == gang else None
        if recorded and (recorded.by is not PlacedBy.RSTORM or recorded.workers):
            return recorded
        pod = self.worker_pod(0, gang=gang)
        if current:
            # Part of this gang exists with no placement on record (an operator from before
            # placement made it): the rest follows it, unpinned.
            by, why = PlacedBy.SCHEDULER, ""
        else:
            by, why = placed_by(self.job, pod)
        if by is not PlacedBy.RSTORM:
            placement = GangPlacement(gang=gang, by=by, message=why)
            self.update(placement=placement)
            return placement
        if recorded is None or recorded.retry_after is None or self.now >= parse_timestamp(recorded.retry_after):
            self.decision.actions.append(PlaceGang(pod, fewest=self.fewest_to_place(recorded), most=self.replicas))
        return None

    def fewest_to_place(self, recorded: GangPlacement | None) -> int:
        """`least`, or spec.workers.minReplicas once R-Storm has found no room for the gang for the
        gang scheduling timeout."""
        timeout = self.settings.gang_scheduling_timeout_seconds
        waited = recorded is not None and recorded.waiting_since is not None and (
            self.now - parse_timestamp(recorded.waiting_since)
        ).total_seconds() >= timeout
        if not waited or self.floor >= self.least:
            return self.least
        self.update_size(reason=f"the whole gang did not fit within the gang scheduling timeout ({timeout:.0f} s)")
        return self.floor

    def progress_phase(self, current: dict[int, WorkerObservation]) -> None:
        states = [worker.state for worker in current.values()]
        if all(state is WorkerState.SUCCEEDED for state in states):
            self.enter(Phase.SUCCEEDED)
            self.update(completion_time=timestamp(self.now), message="")
            self.final_progress(current.get(0))
            self.condition(ConditionType.SUCCEEDED, True, "AllWorkersSucceeded", "every worker finished")
            self.condition(ConditionType.RUNNING, False, "AllWorkersSucceeded")
            self.condition(ConditionType.RESTARTING, False, "AllWorkersSucceeded")
            self.event("Normal", "Succeeded", "every worker finished")
            self.clean_up_pods()
        elif all(state in (WorkerState.RUNNING, WorkerState.SUCCEEDED) for state in states):
            if self.status.phase is not Phase.RUNNING:
                self.enter(Phase.RUNNING)
                self.update(message="")
                running = self.of_replicas(len(current))
                self.condition(ConditionType.RUNNING, True, "AllWorkersRunning", f"{running} running")
                self.condition(ConditionType.RESTARTING, False, "AllWorkersRunning")
                self.event("Normal", "Running", f"{running} running")
        else:
            self.explain_pending(current)

    def final_progress(self, rank0_worker: WorkerObservation | None) -> None:
        """The last scrape may predate the last steps: the final report in worker 0's termination
        message has the step the job ended at."""
        report = rank0_worker.final_report if rank0_worker else None
        if report is None:
            return
        progress = self.status.progress or TrainingProgress()
        final = {"step": report.step, "update_time": timestamp(self.now)}
        if report.timed:  # else the run resumed at its last step: the last scrape's figures stand
            final |= {"step_seconds": round(report.step_seconds, 6), "loss": report.loss}
        self.update(progress=progress.model_copy(update=final))

    def explain_pending(self, current: dict[int, WorkerObservation]) -> None:
        """Say why the gang waits: the first worker with a known cause, in the status, and in an
        Event when the reason changes (not when only its detail does: the kubelet flips between
        ErrImagePull and ImagePullBackOff for as long as an image cannot be pulled)."""
        blocked = [w for w in current.values() if w.state is WorkerState.PENDING and w.pending_reason]
        if not blocked:
            self.update(pending_reason="")
            return
        worker = min(blocked, key=lambda w: w.index)
        others = f" (and {len(blocked) - 1} more workers)" if len(blocked) > 1 else ""
        message = f"{worker.name} is pending{others}: {worker.pending_reason}: {worker.pending_message}"
        if worker.pending_reason != self.status.pending_reason:
            self.event("Warning", worker.pending_reason, message)
        self.update(message=message, pending_reason=worker.pending_reason)

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
        if self.status.phase in FINISHED:
            # Its pending and running pods are being deleted, or with cleanPodPolicy None left to
            # run out: none of them works for the job any more.
            current = [w for w in current if w.state in (WorkerState.SUCCEEDED, WorkerState.FAILED)]
        counts = WorkerCounts(
            total=self.replicas,
            pending=sum(w.state is WorkerState.PENDING for w in current),
            running=sum(w.state is WorkerState.RUNNING for w in current),
            succeeded=sum(w.state is WorkerState.SUCCEEDED for w in current),
            failed=sum(w.state is WorkerState.FAILED for w in current),
        )
        self.update(workers=counts, ready_workers=f"{counts.running}/{self.replicas}")
