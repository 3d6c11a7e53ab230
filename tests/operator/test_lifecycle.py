"""The gang lifecycle state machine, without a cluster: every transition from a status and pods."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from caramel.contract.api import CaramelJobStatus, Phase, TrainingProgress, Tuning, WorkerFailure, WorkerNode
from caramel.contract.jobfile import parse_job
from caramel_operator.config import OperatorSettings
from caramel.contract.progress import ProgressReport
from caramel.contract.restart import SCRIPT_ERROR_WAIT_SECONDS
from caramel.contract.termination import ScriptRaised, failure_cause, failure_message
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, WorkerContract
from caramel.network.wire import job_topology, to_json
from caramel_operator.gang_placement import NoRoom, Placed, Unreadable, placed_topology
from caramel_operator.gang_schedulers import PODGROUPS, ObservedGroup
from caramel_operator import lifecycle
from caramel_operator.lifecycle import (
    EVENT_MESSAGE_BYTES,
    CreateGroup,
    CreateObject,
    CreatePods,
    DeleteGroup,
    DeletePods,
    Observed,
    PlaceGang,
    ReadGroup,
    ReadProgress,
    due,
    expires_at,
    reject_invalid,
    report_creation_failures,
    status_from,
    parse_timestamp,
    timestamp,
)
from caramel_operator.observe import INVALID_IMAGE, WorkerObservation, WorkerState

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=60, gang_scheduling_timeout_seconds=120)
ALL = frozenset({"Service", "NetworkPolicy"})  # the job's own objects exist
# For tests of what follows a gang's creation: the scheduler places it, in one pass.
BY_SCHEDULER = {"placement": {"policy": "Scheduler"}}
ON_N1 = WorkerNode(node="n1", rack="z/r1", zone="z")


def job(**spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo"}, "spec": {"script": "t.py", **spec}}
    )


def worker(index, state=WorkerState.RUNNING, gang=0, **extra):
    return WorkerObservation(name=f"demo-worker-{index}", job="demo", index=index, gang=gang, state=state, **extra)


def status(**fields):
    return CaramelJobStatus(**fields)


def actions_of(decision, kind):
    return [action for action in decision.actions if isinstance(action, kind)]


def reads_of(decision, kind):
    return [read for read in decision.reads if isinstance(read, kind)]


def decide(the_job, last, workers, existing, now, settings, group=None, placement=None):
    """lifecycle.decide over what it observes: `group` and `placement` as the handler read them."""
    return lifecycle.decide(Observed(the_job, last, workers, existing, now, settings, group=group, placement=placement))


def record_placement(asked, the_job, outcome, now, settings):
    """R-Storm's outcome for the placement `asked` asked for, recorded on it: the step a pass given
    the outcome takes, alone (the tests then run the next pass from its status)."""
    [request] = reads_of(asked, PlaceGang)
    assert not request.growing
    return lifecycle.record_placement(Observed(the_job, asked.status, [], ALL, now, settings), asked, outcome)


def record_room(asked, the_job, outcome, now, settings):
    """What a look for room (`asked`) found, recorded on it, as record_placement above."""
    [request] = reads_of(asked, PlaceGang)
    assert request.growing
    return lifecycle.record_room(Observed(the_job, asked.status, [], ALL, now, settings), asked, outcome)


def test_a_new_job_gets_its_service_then_its_placement_then_its_whole_gang():
    first = decide(job(), status(), [], existing=frozenset(), now=NOW, settings=SETTINGS)
    assert [a.manifest["kind"] for a in actions_of(first, CreateObject)] == ["Service", "NetworkPolicy"]
    assert not actions_of(first, CreatePods)
    [place] = reads_of(first, PlaceGang)
    assert place.worker_pod["metadata"]["name"] == "demo-worker-0"
    placed = record_placement(first, job(), Placed(workers=(ON_N1, ON_N1)), NOW, SETTINGS)
    second = decide(job(), placed.status, [], ALL, NOW, SETTINGS)
    [create] = actions_of(second, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-0", "demo-worker-1"]
    assert second.status.phase is Phase.PENDING
    assert second.status.conditions[0].type == "Created"


def test_only_missing_pods_are_created_while_pending():
    decision = decide(job(), status(), [worker(0, WorkerState.PENDING)], ALL, NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-1"]


def test_all_running_is_running():
    started = status(start_time=timestamp(NOW - timedelta(minutes=3)))
    decision = decide(job(), started, [worker(0), worker(1)], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RUNNING
    assert decision.status.start_time == started.start_time  # the job's start, not its gang's
    assert decision.status.ready_workers == "2/2"
    assert decision.transitions == [Phase.RUNNING]


def test_a_deadline_counts_from_the_first_pass_even_for_a_gang_that_never_runs():
    """It counted from when every worker ran: a gang whose image could not be pulled waited forever."""
    deadline = job(runPolicy={"activeDeadlineSeconds": 40}, **BY_SCHEDULER)
    first = decide(deadline, status(), [], ALL, NOW, SETTINGS)
    assert first.status.start_time == timestamp(NOW)
    pulling = worker(0, WorkerState.PENDING, pending_reason="ImagePullFailed", pending_message="ImagePullBackOff")
    waiting = decide(deadline, first.status, [pulling, worker(1)], ALL, NOW + timedelta(seconds=39), SETTINGS)
    assert waiting.status.phase is Phase.PENDING
    late = decide(deadline, waiting.status, [pulling, worker(1)], ALL, NOW + timedelta(seconds=40), SETTINGS)
    assert late.status.phase is Phase.FAILED
    assert any(c.reason == "DeadlineExceeded" for c in late.status.conditions)


def test_a_resumed_job_starts_its_deadline_again():
    """As a Kubernetes Job's: a suspended job is not running."""
    suspended = status(phase=Phase.SUSPENDED, start_time=timestamp(NOW - timedelta(hours=1)))
    resumed = decide(job(runPolicy={"activeDeadlineSeconds": 60}), suspended, [], ALL, NOW, SETTINGS)
    assert resumed.status.phase is Phase.PENDING and resumed.status.start_time == timestamp(NOW)


@pytest.mark.parametrize(
    ("spec", "workers", "counts"),
    [
        ({"runPolicy": {"activeDeadlineSeconds": 60}}, [worker(0), worker(1)], {"running": 0, "pending": 0, "failed": 0}),
        (
            {"runPolicy": {"backoffLimit": 0}},
            [worker(0, WorkerState.FAILED, failure_reason="Error"), worker(1)],
            {"running": 0, "pending": 0, "failed": 1},
        ),
        ({"runPolicy": {"activeDeadlineSeconds": 60, "cleanPodPolicy": "None"}}, [worker(0), worker(1, WorkerState.PENDING)], {"running": 0, "pending": 0}),
    ],
    ids=["deadline", "backoff-limit", "pods-kept"],
)
def test_a_finished_job_counts_no_ready_workers(spec, workers, counts):
    """READY kept 2/2 after DeadlineExceeded and 1/2 after BackoffLimitExceeded."""
    started = status(phase=Phase.RUNNING, start_time=timestamp(NOW - timedelta(seconds=61)))
    decision = decide(job(**spec), started, workers, ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.ready_workers == "0/2"
    assert decision.status.workers.model_dump(include=set(counts)) == counts


def test_all_succeeded_is_succeeded_and_keeps_finished_pods_by_default():
    decision = decide(
        job(), status(phase=Phase.RUNNING), [worker(0, WorkerState.SUCCEEDED), worker(1, WorkerState.SUCCEEDED)], ALL, NOW, SETTINGS
    )
    assert decision.status.phase is Phase.SUCCEEDED
    assert decision.status.completion_time == timestamp(NOW)
    assert not actions_of(decision, DeletePods)


def test_a_failure_restarts_the_gang_with_exponential_backoff():
    failed = worker(1, WorkerState.FAILED, failure_reason="Error", exit_code=3)
    earlier = status(phase=Phase.RUNNING, restarts=2, backed_off_restarts=2)
    decision = decide(job(), earlier, [worker(0), failed], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING
    assert decision.status.restarts == 3 and decision.status.gang == 1
    assert decision.status.backed_off_restarts == 3
    assert decision.status.restart_after == timestamp(NOW + timedelta(seconds=40))  # 10 s x 2^2
    assert due(decision.status, NOW) == NOW + timedelta(seconds=40)
    assert due(decision.status, NOW + timedelta(seconds=40)) is None  # over: the old pods' going, or the interval, calls
    assert decision.status.last_failure.exit_code == 3
    [delete] = actions_of(decision, DeletePods)
    assert sorted(delete.names) == ["demo-worker-0", "demo-worker-1"]
    assert "restarting the whole gang (3 of 3) in 40 s" in decision.status.message


LOST = {
    "pod gone": [],
    "pod being deleted": [worker(1, terminating=True)],
    "stopped by its deletion": [worker(1, WorkerState.FAILED, failure_reason="PodDeleted", exit_code=143, terminating=True)],
    "node lost": [worker(1, WorkerState.FAILED, failure_reason="NodeLost")],
    "evicted": [worker(1, WorkerState.FAILED, failure_reason="Evicted")],
}


@pytest.mark.parametrize("lost", LOST.values(), ids=LOST.keys())
def test_a_lost_worker_restarts_the_gang_at_once_counted_against_the_backoff_limit(lost):
    """No crash loop to slow down: the new gang comes as soon as the old pods are gone. Before,
    a pod deleted waited the backoff as a crash does (10 s, then 20 s, ...)."""
    earlier = status(phase=Phase.RUNNING, restarts=1, backed_off_restarts=1)
    decision = decide(job(**BY_SCHEDULER), earlier, [worker(0), *lost], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING
    assert (decision.status.restarts, decision.status.backed_off_restarts) == (2, 1)
    assert decision.status.restart_after == timestamp(NOW)
    assert "; restarting the whole gang (2 of 3) at once" in decision.status.message
    old_pods_gone = decide(job(**BY_SCHEDULER), decision.status, [], ALL, NOW, SETTINGS)
    [create] = actions_of(old_pods_gone, CreatePods)
    assert [pod["metadata"]["labels"]["caramel.dev/gang"] for pod in create.manifests] == ["1", "1"]


def test_a_crash_waits_the_backoff_of_the_crashes_before_it_not_of_the_losses():
    """Two workers lost before (a spot node, a drain) do not make a first crash wait 40 s."""
    crashed = worker(1, WorkerState.FAILED, failure_reason="Error", exit_code=1)
    decision = decide(job(), status(phase=Phase.RUNNING, restarts=2), [worker(0), crashed], ALL, NOW, SETTINGS)
    assert decision.status.restart_after == timestamp(NOW + timedelta(seconds=10))
    assert (decision.status.restarts, decision.status.backed_off_restarts) == (3, 1)


def test_a_lost_worker_past_the_backoff_limit_fails_the_job():
    decision = decide(job(runPolicy={"backoffLimit": 2}), status(phase=Phase.RUNNING, restarts=2), [worker(0)], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    assert next(c for c in decision.status.conditions if c.type == "Failed").reason == "BackoffLimitExceeded"
    assert decision.status.last_failure == WorkerFailure(worker="demo-worker-1", reason="PodDeleted")


def test_rstorm_places_and_creates_the_gang_in_one_pass():
    """The placement had a pass of its own, and the pods came a reconcile interval later."""
    restarting = status(phase=Phase.RESTARTING, gang=1, restarts=1, restart_after=timestamp(NOW))
    asked = decide(job(), restarting, [], ALL, NOW, SETTINGS)
    [place] = reads_of(asked, PlaceGang)
    placed = decide(job(), restarting, [], ALL, NOW, SETTINGS, placement=Placed(workers=(ON_N1, ON_N1)))
    assert not reads_of(placed, PlaceGang)
    [create] = actions_of(placed, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-0", "demo-worker-1"]
    assert all(pod["metadata"]["labels"]["caramel.dev/gang"] == "1" for pod in create.manifests)
    assert [event.reason for event in placed.events] == ["Placed", "GangCreated"]
    assert placed.status.placement.workers == [ON_N1, ON_N1]
    # No room: recorded, nothing created, and the next try is due after the backoff.
    unplaced = decide(job(), restarting, [], ALL, NOW, SETTINGS, placement=NoRoom("cannot place 2 workers; short of memory"))
    assert not actions_of(unplaced, CreatePods) and not reads_of(unplaced, PlaceGang)
    assert unplaced.status.message.startswith("cannot place the gang: cannot place 2 workers")
    assert due(unplaced.status, NOW) == NOW + timedelta(seconds=10)


def test_nothing_is_due_while_the_gang_runs():
    assert due(status(phase=Phase.RUNNING, restart_after=timestamp(NOW + timedelta(seconds=5))), NOW) is None


def test_backoff_is_capped():
    assert SETTINGS.restart_backoff(10) == 60


def test_the_new_gang_waits_for_the_backoff_and_for_the_old_pods_to_go():
    restarting = status(phase=Phase.RESTARTING, gang=1, restarts=1, restart_after=timestamp(NOW + timedelta(seconds=5)))
    waiting = decide(job(), restarting, [], ALL, NOW, SETTINGS)
    assert not actions_of(waiting, CreatePods)
    later = NOW + timedelta(seconds=6)
    old_pod_terminating = decide(job(), restarting, [worker(0, gang=0, terminating=True)], ALL, later, SETTINGS)
    assert not actions_of(old_pod_terminating, CreatePods)
    ready = decide(job(**BY_SCHEDULER), restarting.model_copy(update={"tuning": Tuning(bucket_bytes=4096)}), [], ALL, later, SETTINGS)
    [create] = actions_of(ready, CreatePods)
    assert all(pod["metadata"]["labels"]["caramel.dev/gang"] == "1" for pod in create.manifests)
    env = {e["name"]: e["value"] for e in create.manifests[0]["spec"]["containers"][0]["env"]}
    assert env["CARAMEL_TUNING"] == '{"bucketBytes":4096,"alphaSeconds":null,"betaSecondsPerByte":null}'


def test_backoff_limit_reached_fails_with_the_workers_reason():
    failed = worker(0, WorkerState.FAILED, failure_reason="OOMKilled", exit_code=137)
    decision = decide(job(runPolicy={"backoffLimit": 1}), status(phase=Phase.RUNNING, restarts=1), [failed, worker(1)], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    failed_condition = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed_condition.reason == "BackoffLimitExceeded"
    assert failed_condition.message.startswith("worker demo-worker-0 failed: OOMKilled, exit code 137")
    [delete] = actions_of(decision, DeletePods)
    assert delete.names == ["demo-worker-1"]  # cleanPodPolicy Running: the failed pod and its log stay


@pytest.mark.parametrize(("policy", "deleted"), [("None", []), ("Running", ["demo-worker-1"]), ("All", ["demo-worker-0", "demo-worker-1"])])
def test_clean_pod_policy(policy, deleted):
    workers = [worker(0, WorkerState.FAILED, failure_reason="Error"), worker(1)]
    decision = decide(job(runPolicy={"cleanPodPolicy": policy}), status(phase=Phase.FAILED), workers, ALL, NOW, SETTINGS)
    assert sorted(name for action in actions_of(decision, DeletePods) for name in action.names) == deleted


def test_a_deleted_pod_of_a_running_gang_is_a_failure():
    decision = decide(job(), status(phase=Phase.RUNNING), [worker(0)], ALL, NOW, SETTINGS)
    assert decision.status.last_failure.reason == "PodDeleted"
    assert decision.status.last_failure.worker == "demo-worker-1"
    assert decision.status.phase is Phase.RESTARTING


def test_the_worker_that_failed_first_is_blamed_and_those_that_followed_are_named():
    """On v1.36 rank 1 was killed, rank 0 followed with "Connection reset by peer", and the
    status and Event blamed worker 0, the lowest-numbered."""
    killed = worker(1, WorkerState.FAILED, failure_reason="Error", exit_code=137, failure_cause="rank 1 killed by SIGKILL",
                    failed_at=NOW - timedelta(seconds=1))
    follower = worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1,
                      failure_cause="rank 0 | Aborting RingReduce with UNAVAILABLE: Connection reset by peer", failed_at=NOW - timedelta(milliseconds=998))
    decision = decide(job(), status(phase=Phase.RUNNING), [follower, killed], ALL, NOW, SETTINGS)
    assert decision.status.last_failure.worker == "demo-worker-1"
    assert decision.status.message.startswith(
        "worker demo-worker-1 failed: Error, exit code 137: rank 1 killed by SIGKILL; demo-worker-0 (Error, exit code 1) failed after it;"
    )
    assert decision.events[0].message.startswith("worker demo-worker-1 failed")


def test_a_worker_gone_with_its_pod_is_blamed_before_those_that_failed_after():
    """A pod deleted and gone tells no time; no peer's failure takes a pod away, so it came first."""
    follower = worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1, failed_at=NOW - timedelta(seconds=1))
    decision = decide(job(workers={"replicas": 3}), status(phase=Phase.RUNNING), [follower, worker(2)], ALL, NOW, SETTINGS)
    assert decision.status.last_failure == WorkerFailure(worker="demo-worker-1", reason="PodDeleted")
    assert "; demo-worker-0 (Error, exit code 1) failed after it" in decision.status.message


def test_a_lost_node_restarts_and_force_deletes_its_pod():
    lost = worker(1, WorkerState.FAILED, failure_reason="NodeLost")
    decision = decide(job(), status(phase=Phase.RUNNING), [worker(0), lost], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING
    forced = [a for a in actions_of(decision, DeletePods) if a.force]
    assert forced and forced[0].names == ["demo-worker-1"]


def test_deadline_fails_the_job():
    started = status(phase=Phase.RUNNING, start_time=timestamp(NOW - timedelta(seconds=61)))
    decision = decide(job(runPolicy={"activeDeadlineSeconds": 60}), started, [worker(0), worker(1)], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.conditions[-1].reason == "DeadlineExceeded" or any(
        c.reason == "DeadlineExceeded" for c in decision.status.conditions
    )
    assert sorted(actions_of(decision, DeletePods)[0].names) == ["demo-worker-0", "demo-worker-1"]


def test_ttl_expiry_of_a_finished_job():
    finished = status(phase=Phase.SUCCEEDED, completion_time=timestamp(NOW - timedelta(seconds=30)))
    assert expires_at(60, finished) == NOW + timedelta(seconds=30)
    assert expires_at(None, finished) is None
    assert expires_at(60, status(phase=Phase.RUNNING)) is None


def test_suspend_and_resume():
    suspended = decide(job(runPolicy={"suspend": True}), status(phase=Phase.RUNNING), [worker(0), worker(1)], ALL, NOW, SETTINGS)
    assert suspended.status.phase is Phase.SUSPENDED
    assert sorted(actions_of(suspended, DeletePods)[0].names) == ["demo-worker-0", "demo-worker-1"]
    resumed = decide(job(), suspended.status, [], ALL, NOW, SETTINGS)
    assert resumed.status.phase is Phase.PENDING and resumed.status.gang == 1
    [place] = reads_of(resumed, PlaceGang)  # the resumed gang is placed afresh
    assert place.worker_pod["metadata"]["labels"]["caramel.dev/gang"] == "1"


def test_pending_reason_is_reported_once():
    stuck = worker(1, WorkerState.PENDING, pending_reason="Unschedulable", pending_message="0/3 nodes are available")
    first = decide(job(), status(), [worker(0), stuck], ALL, NOW, SETTINGS)
    assert first.status.message == "demo-worker-1 is pending: Unschedulable: 0/3 nodes are available"
    assert [e.reason for e in first.events] == ["Unschedulable"]
    again = decide(job(), first.status, [worker(0), stuck], ALL, NOW, SETTINGS)
    assert again.events == []


def test_a_pending_reason_gets_one_event_however_often_its_detail_flips():
    """The kubelet flips between ErrImagePull and ImagePullBackOff: 10 Events in 4 minutes."""
    current = status()
    events = []
    for flip in range(10):
        detail = ("ErrImagePull", "ImagePullBackOff")[flip % 2]
        pulling = worker(0, WorkerState.PENDING, pending_reason="ImagePullFailed", pending_message=f"{detail}: no such image")
        decision = decide(job(), current, [pulling, worker(1)], ALL, NOW, SETTINGS)
        assert decision.status.message.endswith(f"ImagePullFailed: {detail}: no such image")
        events += decision.events
        current = decision.status
    assert [e.reason for e in events] == ["ImagePullFailed"]
    stuck = worker(0, WorkerState.PENDING, pending_reason="Unschedulable", pending_message="0/3 nodes are available")
    assert [e.reason for e in decide(job(), current, [stuck, worker(1)], ALL, NOW, SETTINGS).events] == ["Unschedulable"]


def test_condition_transition_time_moves_only_on_change():
    running = decide(job(), status(), [worker(0), worker(1)], ALL, NOW, SETTINGS).status
    later = decide(job(), running, [worker(0), worker(1)], ALL, NOW + timedelta(minutes=5), SETTINGS).status
    assert later.conditions == running.conditions


def test_invalid_spec_fails_once_and_creates_nothing():
    decision = reject_invalid(status(), "spec.workers.replicas: too small", NOW)
    assert decision.status.phase is Phase.FAILED and decision.actions == []
    assert decision.status.conditions[0].reason == "InvalidSpec"
    assert reject_invalid(decision.status, "same", NOW).events == []


def test_status_from_ignores_foreign_keys():
    assert status_from({"phase": "Running", "kopf": {"progress": {}}}).phase is Phase.RUNNING
    assert status_from(None) == CaramelJobStatus()


def test_a_gang_size_written_under_its_former_field_names_is_read_by_an_upgraded_operator():
    size = status_from({"size": {"gang": 2, "replicas": 3, "least": 2, "reason": "demo-worker-3 (NodeLost) was lost"}}).size
    assert size is not None and (size.gang, size.workers, size.next_min_workers) == (2, 3, 2)
    assert size.reason == "demo-worker-3 (NodeLost) was lost"


def test_finished_jobs_are_left_alone():
    """No actions and no events for a finished job (the handlers also take it off the timer)."""
    done = status(phase=Phase.SUCCEEDED, completion_time=timestamp(NOW))
    decision = decide(job(), done, [worker(0, WorkerState.SUCCEEDED), worker(1, WorkerState.SUCCEEDED)], ALL, NOW, SETTINGS)
    assert decision.actions == [] and decision.events == [] and decision.status == done.model_copy(update={"workers": decision.status.workers, "ready_workers": "0/2"})


def test_network_policy_only_when_enabled():
    off = OperatorSettings(network_policy=False)
    decision = decide(job(), status(), [], frozenset(), NOW, off)
    assert [a.manifest["kind"] for a in actions_of(decision, CreateObject)] == ["Service"]
    assert not actions_of(decide(job(), status(), [], frozenset({"Service"}), NOW, off), CreateObject)


def test_a_template_that_weakens_pod_security_fails_naming_the_field():
    template = {"spec": {"securityContext": {"runAsUser": 0}, "volumes": [{"name": "ckpt", "hostPath": {"path": "/ckpt"}}]}}
    decision = decide(job(workers={"template": template}), status(), [], frozenset(), NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED and decision.actions == []
    message = decision.status.message
    assert "spec.workers.template.spec.securityContext.runAsUser: must not be 0 (root)" in message
    assert "spec.workers.template.spec.volumes[ckpt]: volume type hostPath is not allowed" in message
    assert [e.reason for e in decision.events] == ["InvalidSpec"]


def test_a_template_may_change_pod_security_within_restricted():
    template = {"spec": {"securityContext": {"runAsUser": 2000, "fsGroup": 3000}}}
    decision = decide(job(workers={"template": template}, **BY_SCHEDULER), status(), [], frozenset(), NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert create.manifests[0]["spec"]["securityContext"]["runAsUser"] == 2000
    assert create.manifests[0]["spec"]["securityContext"]["fsGroup"] == 3000


def test_an_invalid_image_name_fails_the_job_at_once():
    bad = worker(1, WorkerState.PENDING, pending_reason=INVALID_IMAGE, pending_message='InvalidImageName: "Caramel:x"')
    decision = decide(job(), status(), [worker(0, WorkerState.PENDING), bad], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED and decision.status.restarts == 0
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed.reason == "InvalidImage" and "check spec.image" in failed.message


def test_a_partly_scheduled_gang_is_released_after_the_timeout_and_retried():
    created = timestamp(NOW - timedelta(seconds=121))
    holding = worker(0, WorkerState.RUNNING, scheduled=True, created=created)
    stuck = worker(1, WorkerState.PENDING, pending_reason="Unschedulable", pending_message="0/1 nodes: Insufficient cpu", created=created)
    decision = decide(job(), status(), [holding, stuck], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING and decision.status.gang == 1
    assert decision.status.last_failure.reason == "GangUnschedulable"
    assert "released the partly scheduled gang: 1 of 2 workers unschedulable for 121 s" in decision.status.message
    assert sorted(actions_of(decision, DeletePods)[0].names) == ["demo-worker-0", "demo-worker-1"]
    recent = timestamp(NOW - timedelta(seconds=60))
    early = decide(job(), status(), [replace(holding, created=recent), replace(stuck, created=recent)], ALL, NOW, SETTINGS)
    assert early.status.phase is Phase.PENDING
    nothing_held = decide(job(), status(), [stuck, worker(0, WorkerState.PENDING, pending_reason="Unschedulable", created=created)], ALL, NOW, SETTINGS)
    assert nothing_held.status.phase is Phase.PENDING, "a gang that holds nothing may wait"


def test_success_records_the_final_progress_from_rank0():
    report = ProgressReport(step=200, total=200, loss=0.15, step_seconds=0.025, examples_per_second=5000.0, final=True)
    running = status(phase=Phase.RUNNING, progress={"step": 174, "bandwidth": "1.0 GB/s"})
    workers = [worker(0, WorkerState.SUCCEEDED, final_report=report), worker(1, WorkerState.SUCCEEDED)]
    decision = decide(job(), running, workers, ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.SUCCEEDED
    assert decision.status.progress.step == 200 and decision.status.progress.loss == 0.15
    assert decision.status.progress.bandwidth == "1.0 GB/s"


def test_a_gang_resumed_at_the_last_step_still_records_the_final_step():
    """A checkpoint already at the last step left the new gang nothing to run: it wrote no final
    report, and the job showed Succeeded at STEP 36 of a run that ended at 120. Now its report
    has the step, and no step time or loss: the last scrape's figures stand."""
    report = ProgressReport(step=120, total=120, loss=float("nan"), step_seconds=0.0, examples_per_second=0.0, final=True)
    running = status(phase=Phase.RUNNING, progress={"step": 36, "stepSeconds": 0.2, "loss": 0.5})
    workers = [worker(0, WorkerState.SUCCEEDED, final_report=report), worker(1, WorkerState.SUCCEEDED)]
    progress = decide(job(), running, workers, ALL, NOW, SETTINGS).status.progress
    assert (progress.step, progress.step_seconds, progress.loss) == (120, 0.2, 0.5)


def test_a_failure_names_its_cause_and_its_event_keeps_the_last_lines():
    summary = "\n".join(["rank 1 exited with code 1", "rank 1 | ValueError: bad shard", "...", *(f"rank 1 | line {i}" for i in range(200))])
    failed = worker(1, WorkerState.FAILED, failure_reason="Error", exit_code=1, failure_cause="rank 1 | ValueError: bad shard", failure_message=summary)
    decision = decide(job(), status(phase=Phase.RUNNING), [worker(0), failed], ALL, NOW, SETTINGS)
    assert decision.status.message.startswith("worker demo-worker-1 failed: Error, exit code 1: rank 1 | ValueError: bad shard;")
    assert decision.status.last_failure.message == summary
    [event] = decision.events
    lines = event.message.splitlines()
    assert lines[0] == decision.status.message  # which names the cause
    assert lines[-1] == "rank 1 | line 199" and len(event.message.encode()) <= EVENT_MESSAGE_BYTES


@pytest.mark.parametrize(("gang_timeout", "expected"), [(120, RENDEZVOUS_TIMEOUT_SECONDS), (900, 900)])
def test_the_workers_wait_for_each_other_at_least_as_long_as_the_gang_may_wait(gang_timeout, expected):
    """Worker 0's Gloo gave up after 30 s, its default, on a peer still pending for CPU."""
    settings = SETTINGS.model_copy(update={"gang_scheduling_timeout_seconds": gang_timeout})
    [create] = actions_of(decide(job(**BY_SCHEDULER), status(), [], ALL, NOW, settings), CreatePods)
    for pod in create.manifests:
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(expected)


def test_creation_refusals_reach_the_status_and_one_event():
    first = decide(job(**BY_SCHEDULER), status(), [], ALL, NOW, SETTINGS)
    refusal = 'Pod demo-worker-0: pods "demo-worker-0" is forbidden: exceeded quota: q'
    reported = report_creation_failures(first, [refusal, "Pod demo-worker-1: ..."])
    assert reported.status.message == f"cannot create the job's objects: {refusal} (and 1 more refusals)"
    assert [e.reason for e in reported.events] == ["GangCreated", "FailedCreate"]
    again = report_creation_failures(decide(job(**BY_SCHEDULER), reported.status, [], ALL, NOW, SETTINGS), [refusal, "Pod demo-worker-1: ..."])
    assert "FailedCreate" not in [e.reason for e in again.events]


# --- placement --------------------------------------------------------------------------------

ON_N2 = WorkerNode(node="n2", rack="z/r2", zone="z")


def env(pod):
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def pinned_node(pod):
    [term] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [pin] = term["matchFields"]
    assert pin["key"] == "metadata.name" and pin["operator"] == "In"
    return pin["values"][0]


def placed_gang(the_job, workers, gang_status=None):
    """The status after R-Storm placed the gang, and the pods the next pass creates."""
    asked = decide(the_job, gang_status or status(), [], ALL, NOW, SETTINGS)
    assert reads_of(asked, PlaceGang) and not actions_of(asked, CreatePods)
    recorded = record_placement(asked, the_job, Placed(workers=tuple(workers)), NOW, SETTINGS)
    [create] = actions_of(decide(the_job, recorded.status, [], ALL, NOW, SETTINGS), CreatePods)
    return recorded, create.manifests


def test_ranks_follow_the_placement_and_every_worker_gets_the_placed_topology():
    the_job = job(workers={"replicas": 3, "slotsPerWorker": 2})
    recorded, pods = placed_gang(the_job, [ON_N1, ON_N1, ON_N2])
    assert recorded.status.placement.by == "RStorm" and recorded.status.placement.gang == 0
    assert [e.reason for e in recorded.events] == ["Placed"]
    assert recorded.events[0].message == "R-Storm placed 3 workers on 2 nodes in 2 racks (status.placement)"
    assert [pinned_node(pod) for pod in pods] == ["n1", "n1", "n2"]
    topology = placed_topology([ON_N1, ON_N1, ON_N2], 2, SETTINGS.links)
    assert {env(pod)["CARAMEL_TOPOLOGY"] for pod in pods} == {to_json(topology)}
    received = job_topology(WorkerContract.from_env(env(pods[2])))
    assert received.size == 6 and received.groups[-2:] == ("z/r2", "z/r2")


def test_a_missing_worker_of_a_placed_gang_keeps_its_node_and_the_gangs_topology():
    recorded, pods = placed_gang(job(), [ON_N1, ON_N2])
    again = decide(job(), recorded.status, [worker(0, WorkerState.PENDING)], ALL, NOW, SETTINGS)
    assert not reads_of(again, PlaceGang)
    [create] = actions_of(again, CreatePods)
    assert [pinned_node(pod) for pod in create.manifests] == ["n2"]
    assert env(create.manifests[0])["CARAMEL_TOPOLOGY"] == env(pods[1])["CARAMEL_TOPOLOGY"]


def test_a_gang_without_room_waits_says_why_and_is_placed_again_after_the_backoff():
    asked = decide(job(), status(), [], ALL, NOW, SETTINGS)
    full = record_placement(asked, job(), NoRoom("cannot place 2 workers; short of memory"), NOW, SETTINGS)
    message = "cannot place the gang: cannot place 2 workers; short of memory; trying again in 10 s"
    assert full.status.message == message
    assert [(e.type, e.reason, e.message) for e in full.events] == [("Warning", "Unplaceable", message)]
    assert full.status.placement.retry_after == timestamp(NOW + timedelta(seconds=10)) and not full.status.placement.workers
    waiting = decide(job(), full.status, [], ALL, NOW + timedelta(seconds=9), SETTINGS)
    assert not waiting.actions and waiting.status.phase is Phase.PENDING
    retried = decide(job(), full.status, [], ALL, NOW + timedelta(seconds=10), SETTINGS)
    assert reads_of(retried, PlaceGang)
    second = record_placement(retried, job(), NoRoom("still short"), NOW + timedelta(seconds=10), SETTINGS)
    assert second.status.placement.attempts == 2 and second.status.message.endswith("trying again in 20 s")
    placed = record_placement(retried, job(), Placed(workers=(ON_N1, ON_N1)), NOW + timedelta(seconds=30), SETTINGS)
    assert placed.status.message == "" and placed.status.placement.retry_after is None


def test_nodes_short_of_cpu_are_named_and_the_gang_still_created():
    asked = decide(job(), status(), [], ALL, NOW, SETTINGS)
    recorded = record_placement(asked, job(), Placed(workers=(ON_N1, ON_N1), cpu_short=("n1",)), NOW, SETTINGS)
    assert recorded.status.message.startswith("placed with too little free CPU on n1")
    assert [e.reason for e in recorded.events] == ["Placed", "PlacedCpuShort"]
    assert actions_of(decide(job(), recorded.status, [], ALL, NOW, SETTINGS), CreatePods)


def test_auto_leaves_placement_to_the_scheduler_where_nodes_cannot_be_read():
    asked = decide(job(), status(), [], ALL, NOW, SETTINGS)
    refused = 'nodes is forbidden: User "system:serviceaccount:caramel-system:caramel-operator" cannot list resource "nodes"'
    recorded = record_placement(asked, job(), Unreadable(refused), NOW, SETTINGS)
    assert recorded.status.placement.by == "Scheduler" and refused in recorded.status.placement.message
    assert [e.reason for e in recorded.events] == ["PlacementUnavailable"]
    [create] = actions_of(decide(job(), recorded.status, [], ALL, NOW, SETTINGS), CreatePods)
    assert all("affinity" not in pod["spec"] and "CARAMEL_TOPOLOGY" not in env(pod) for pod in create.manifests)


def test_rstorm_asked_for_waits_where_nodes_cannot_be_read():
    the_job = job(placement={"policy": "RStorm"})
    asked = decide(the_job, status(), [], ALL, NOW, SETTINGS)
    recorded = record_placement(asked, the_job, Unreadable("nodes is forbidden"), NOW, SETTINGS)
    assert recorded.status.message.startswith(
        "cannot place the gang: R-Storm placement (spec.placement.policy RStorm) needs to list nodes and pods cluster-wide: nodes is forbidden"
    )
    assert not actions_of(decide(the_job, recorded.status, [], ALL, NOW, SETTINGS), CreatePods)


def test_the_scheduler_and_kueue_policies_create_the_gang_at_once_unpinned():
    for the_job, by in ((job(**BY_SCHEDULER), "Scheduler"), (job(runPolicy={"schedulingPolicy": {"queue": "research"}}), "Kueue")):
        decision = decide(the_job, status(), [], ALL, NOW, SETTINGS)
        assert not reads_of(decision, PlaceGang)
        [create] = actions_of(decision, CreatePods)
        assert decision.status.placement.by == by
        assert all("affinity" not in pod["spec"] and "CARAMEL_TOPOLOGY" not in env(pod) for pod in create.manifests)


def test_each_gang_restart_places_the_gang_again():
    recorded, _ = placed_gang(job(), [ON_N1, ON_N2])
    running = recorded.status.model_copy(update={"phase": Phase.RUNNING})
    failed = decide(job(), running, [worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1), worker(1)], ALL, NOW, SETTINGS)
    assert failed.status.gang == 1 and failed.status.placement.gang == 0
    after_backoff = decide(job(), failed.status, [], ALL, NOW + timedelta(seconds=11), SETTINGS)
    [place] = reads_of(after_backoff, PlaceGang)
    assert place.worker_pod["metadata"]["labels"]["caramel.dev/gang"] == "1" and not actions_of(after_backoff, CreatePods)


def test_a_partial_gang_with_no_placement_on_record_is_completed_unpinned():
    decision = decide(job(), status(), [worker(0, WorkerState.PENDING)], ALL, NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert decision.status.placement.by == "Scheduler" and "affinity" not in create.manifests[0]["spec"]


def test_rstorm_against_kueue_topology_aware_scheduling_fails_the_spec_naming_the_field():
    tas = {"metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": "cloud.example.com/rack"}}}
    decision = decide(job(placement={"policy": "RStorm"}, workers={"template": tas}), status(), [], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED and not decision.actions
    assert decision.status.message.startswith("invalid spec: spec.placement.policy: RStorm pins every worker to a node")


VOLCANO = {"runPolicy": {"schedulingPolicy": {"gangScheduler": "Volcano", "queue": "training"}}}


def podgroup(phase=None, gang=0):
    """The gang's PodGroup as the handler read it, with the phase Volcano gave it."""
    return ObservedGroup(gang, {"metadata": {"name": f"demo-gang-{gang}"}, "status": {"phase": phase} if phase else {}})


def test_a_volcano_gang_gets_its_podgroup_first_and_its_pods_once_volcano_admits_it():
    unread = decide(job(**VOLCANO), status(), [], ALL, NOW, SETTINGS)
    assert not unread.actions and unread.status.placement.by == "Volcano"
    assert unread.reads == [ReadGroup(PODGROUPS, "demo-gang-0", 0)]  # the handler reads it, and decides again with it
    first = decide(job(**VOLCANO), status(), [], ALL, NOW, SETTINGS, ObservedGroup(0))
    [create] = actions_of(first, CreateGroup)
    assert create.resource == PODGROUPS and create.manifest["spec"]["minMember"] == 2
    assert not actions_of(first, CreatePods) and first.status.phase is Phase.PENDING
    created = decide(job(**VOLCANO), first.status, [], ALL, NOW, SETTINGS, podgroup())
    assert not created.actions and created.status.message == "waiting for Volcano to admit PodGroup demo-gang-0, a gang of 2 workers"
    assert [e.reason for e in created.events] == ["WaitingForAdmission"]
    pending = decide(job(**VOLCANO), created.status, [], ALL, NOW, SETTINGS, podgroup("Pending"))
    assert not pending.actions and pending.status.message.endswith("a gang of 2 workers (phase Pending)")
    assert not pending.events  # one Event for the wait, not one per phase
    admitted = decide(job(**VOLCANO), pending.status, [], ALL, NOW, SETTINGS, podgroup("Inqueue"))
    [pods] = actions_of(admitted, CreatePods)
    assert [pod["spec"]["schedulerName"] for pod in pods.manifests] == ["volcano", "volcano"]
    assert {pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for pod in pods.manifests} == {"demo-gang-0"}
    assert not actions_of(admitted, CreateGroup) and all("affinity" not in pod["spec"] for pod in pods.manifests)


def test_the_missing_pods_of_an_admitted_volcano_gang_need_no_second_admission():
    decision = decide(job(**VOLCANO), status(), [worker(0, WorkerState.PENDING)], ALL, NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-1"]


def test_a_volcano_job_where_the_api_serves_no_podgroups_fails_naming_the_field_and_what_to_install():
    decision = decide(job(**VOLCANO), status(), [], ALL, NOW, SETTINGS, ObservedGroup(0, served=False))
    assert decision.status.phase is Phase.FAILED and not actions_of(decision, CreateGroup)
    [failed] = [c for c in decision.status.conditions if c.type == "Failed"]
    assert failed.reason == "GangSchedulerMissing"
    assert failed.message.startswith(
        "spec.runPolicy.schedulingPolicy.gangScheduler Volcano: the API server does not serve podgroups.scheduling.volcano.sh/v1beta1; install Volcano"
    )
    assert [e.reason for e in decision.events] == ["GangSchedulerMissing"]


def test_a_restarted_or_suspended_volcano_gang_deletes_its_podgroup():
    running = status(phase=Phase.RUNNING, start_time=timestamp(NOW))
    failed = decide(job(**VOLCANO), running, [worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1), worker(1)], ALL, NOW, SETTINGS)
    assert failed.status.gang == 1 and actions_of(failed, DeleteGroup) == [DeleteGroup(PODGROUPS, "demo-gang-0")]
    suspended = decide(job(runPolicy={**VOLCANO["runPolicy"], "suspend": True}), running, [worker(0), worker(1)], ALL, NOW, SETTINGS)
    assert actions_of(suspended, DeleteGroup) == [DeleteGroup(PODGROUPS, "demo-gang-0")]
    # Kueue's groups are its own: nothing to delete.
    kueue = {"runPolicy": {"schedulingPolicy": {"queue": "research"}}}
    assert not actions_of(decide(job(**kueue), running, [worker(0, WorkerState.FAILED, failure_reason="Error"), worker(1)], ALL, NOW, SETTINGS), DeleteGroup)


def test_auto_says_why_the_scheduler_places_a_gang_asking_for_a_resource_rstorm_does_not_weigh():
    decision = decide(job(workers={"resources": {"limits": {"example.com/fpga": 1}}}), status(), [], ALL, NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert decision.status.placement.by == "Scheduler" and "affinity" not in create.manifests[0]["spec"]
    assert decision.status.placement.message.startswith("R-Storm weighs CPU, memory and GPUs only and the workers ask for example.com/fpga")


def test_a_gpu_gang_is_placed_by_rstorm_in_the_gpu_image_with_the_gpu_nodes_tolerations_and_a_rank_per_gpu():
    gpus = {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 4, "memory": "32Gi"}}, "template": {"spec": {"tolerations": [{"key": "team", "operator": "Exists"}]}}}
    first = decide(job(workers=gpus), status(), [], ALL, NOW, SETTINGS)
    [place] = reads_of(first, PlaceGang)  # R-Storm weighs GPUs: the gang is its to place
    placed = record_placement(first, job(workers=gpus), Placed(workers=(ON_N1, ON_N1)), NOW, SETTINGS)
    [create] = actions_of(decide(job(workers=gpus), placed.status, [], ALL, NOW, SETTINGS), CreatePods)
    for pod in [place.worker_pod, *create.manifests]:
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert container["image"] == "caramel-runtime-gpu:0.1.0"
        assert container["resources"] == {"limits": {"nvidia.com/gpu": "4", "memory": "32Gi"}}
        assert (env["HOROVOD_LOCAL_SIZE"], env["CARAMEL_GPUS_PER_WORKER"], env["HOROVOD_SIZE"]) == ("4", "4", "8")
        assert pod["spec"]["tolerations"] == [
            {"key": "team", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    cpu = decide(job(workers={"replicas": 2}), status(), [], ALL, NOW, SETTINGS)
    [place] = reads_of(cpu, PlaceGang)
    assert place.worker_pod["spec"]["containers"][0]["image"] == "caramel-runtime:0.1.0" and "tolerations" not in place.worker_pod["spec"]


def test_a_gpu_job_without_a_gpu_image_is_refused_naming_spec_image():
    no_gpu_image = SETTINGS.model_copy(update={"gpu_runtime_image": ""})
    decision = decide(job(workers={"resources": {"limits": {"nvidia.com/gpu": 1}}}), status(), [], ALL, NOW, no_gpu_image)
    assert decision.status.phase is Phase.FAILED and not actions_of(decision, CreatePods)
    assert decision.status.message.startswith("invalid spec: spec.image: the job asks for GPUs (spec.workers.resources.limits nvidia.com/gpu)")


# --- gangs that shrink instead of waiting, and grow back (spec.workers.minReplicas) ------------

ELASTIC = {"replicas": 4, "minReplicas": 2}
ON = [WorkerNode(node=f"n{i}", rack="z/r1", zone="z") for i in range(4)]


def running_gang(count, gang=0, by="Scheduler", size=None, **status_fields):
    """The status of a running gang of `count` workers (`size`: more of status.size), and its workers."""
    recorded = status(
        phase=Phase.RUNNING,
        gang=gang,
        start_time=timestamp(NOW - timedelta(minutes=5)),
        placement={"gang": gang, "by": by, "workers": [w.model_dump() for w in ON[:count]] if by == "RStorm" else []},
        size={"gang": gang, "workers": count, "nextMinWorkers": count, **(size or {})},
        **status_fields,
    )
    return recorded, [worker(index, gang=gang) for index in range(count)]


def created(the_job, restarting):
    """The pods created once a restart's backoff is over and the old gang is gone."""
    later = parse_timestamp(restarting.restart_after) + timedelta(seconds=1)
    decision = decide(the_job, restarting, [], ALL, later, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    return decision, create.manifests


def resized(decision):
    return next((c for c in decision.status.conditions if c.type == "Resized"), None)


def test_a_lost_worker_restarts_the_gang_with_the_survivors_from_its_checkpoint():
    the_job = job(workers=ELASTIC, **BY_SCHEDULER)
    running, workers = running_gang(4)
    workers[3] = worker(3, WorkerState.FAILED, failure_reason="NodeLost")
    lost = decide(the_job, running, workers, ALL, NOW, SETTINGS)
    assert lost.status.phase is Phase.RESTARTING and lost.status.restarts == 1  # a failure, against backoffLimit
    assert (lost.status.size.next_min_workers, lost.status.size.reason) == (3, "demo-worker-3 (NodeLost) was lost")
    assert [a.names for a in actions_of(lost, DeletePods) if a.force] == [["demo-worker-3"]]
    after, pods = created(the_job, lost.status)
    assert [pod["metadata"]["name"] for pod in pods] == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert {(env(pod)["HOROVOD_SIZE"], env(pod)["HOROVOD_CROSS_SIZE"], env(pod)["CARAMEL_FULL_SIZE"]) for pod in pods} == {("3", "3", "4")}
    assert after.status.size.workers == 3 and after.status.size.gang == 1
    message = "running 3 of 4 workers: demo-worker-3 (NodeLost) was lost"
    assert [(e.type, e.reason, e.message) for e in after.events if e.reason == "Resized"] == [("Warning", "Resized", message)]
    assert (resized(after).status, resized(after).reason, resized(after).message) == ("True", "FewerWorkers", message)
    later = parse_timestamp(lost.status.restart_after) + timedelta(seconds=2)
    running_again = decide(the_job, after.status, [worker(i, gang=1) for i in range(3)], ALL, later, SETTINGS)
    assert running_again.status.phase is Phase.RUNNING and running_again.status.ready_workers == "3/4"
    assert running_again.status.conditions[[c.type for c in running_again.status.conditions].index("Running")].message == "3 of 4 workers running"


def test_lost_workers_never_shrink_a_gang_below_min_replicas_nor_one_without_it():
    running, workers = running_gang(4)
    workers[2:] = [worker(2, WorkerState.FAILED, failure_reason="Evicted"), worker(3, WorkerState.FAILED, failure_reason="NodeLost")]
    shrunk = decide(job(workers={"replicas": 4, "minReplicas": 3}, **BY_SCHEDULER), running, workers, ALL, NOW, SETTINGS)
    assert shrunk.status.size.next_min_workers == 3
    assert shrunk.status.size.reason == "demo-worker-2 (Evicted), demo-worker-3 (NodeLost) were lost"
    whole = decide(job(workers={"replicas": 4}, **BY_SCHEDULER), running, workers, ALL, NOW, SETTINGS)
    assert whole.status.size.next_min_workers == 4
    _, pods = created(job(workers={"replicas": 4}, **BY_SCHEDULER), whole.status)
    assert len(pods) == 4


def test_a_deleted_pod_counts_as_lost_and_rstorm_places_the_survivors_and_more_where_they_fit():
    the_job = job(workers=ELASTIC)
    running, workers = running_gang(4, by="RStorm")
    lost = decide(the_job, running, workers[:3], ALL, NOW, SETTINGS)  # demo-worker-3's pod is gone
    assert lost.status.size.reason == "demo-worker-3 (PodDeleted) was lost"
    later = NOW + timedelta(seconds=11)
    [place] = reads_of(decide(the_job, lost.status, [], ALL, later, SETTINGS), PlaceGang)
    assert (place.min_workers, place.replicas, place.growing) == (3, 4, False)


def test_a_gang_that_finds_no_room_is_placed_smaller_after_the_gang_scheduling_timeout():
    the_job = job(workers=ELASTIC)
    asked = decide(the_job, status(), [], ALL, NOW, SETTINGS)
    [place] = reads_of(asked, PlaceGang)
    assert (place.min_workers, place.replicas) == (4, 4)  # the whole gang first
    full = record_placement(asked, the_job, NoRoom("cannot place 4 workers; short of memory"), NOW, SETTINGS)
    assert full.status.placement.waiting_since == timestamp(NOW)
    still = record_placement(
        decide(the_job, full.status, [], ALL, NOW + timedelta(seconds=10), SETTINGS), the_job, NoRoom("short"), NOW + timedelta(seconds=10), SETTINGS
    )
    assert still.status.placement.waiting_since == timestamp(NOW)  # the wait counts from the first try
    before = decide(the_job, still.status, [], ALL, NOW + timedelta(seconds=119), SETTINGS)
    [place] = reads_of(before, PlaceGang)
    assert place.min_workers == 4  # a second short of the gang scheduling timeout
    waited = NOW + timedelta(seconds=121)
    asked_fewer = decide(the_job, still.status, [], ALL, waited, SETTINGS)
    [place] = reads_of(asked_fewer, PlaceGang)
    assert (place.min_workers, place.replicas) == (2, 4)
    placed = record_placement(asked_fewer, the_job, Placed(workers=tuple(ON[:3])), waited, SETTINGS)
    decision = decide(the_job, placed.status, [], ALL, waited, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert [pinned_node(pod) for pod in create.manifests] == ["n0", "n1", "n2"]
    assert {env(pod)["HOROVOD_SIZE"] for pod in create.manifests} == {"3"}
    message = "running 3 of 4 workers: the whole gang did not fit within the gang scheduling timeout (120 s)"
    assert [e.message for e in decision.events if e.reason == "Resized"] == [message]
    assert decision.status.size.next_look == timestamp(waited + timedelta(seconds=120))


def test_a_partly_scheduled_gang_runs_with_its_scheduled_part_after_the_timeout():
    the_job = job(workers=ELASTIC, **BY_SCHEDULER)
    pending, _ = running_gang(4)
    pending = pending.model_copy(update={"phase": Phase.PENDING, "restarts": 1})
    made = timestamp(NOW - timedelta(seconds=121))
    stuck = worker(3, WorkerState.PENDING, pending_reason="Unschedulable", pending_message="0/3 nodes: Insufficient cpu", created=made)
    workers = [worker(i, WorkerState.RUNNING if i else WorkerState.PENDING, scheduled=True, created=made) for i in range(3)] + [stuck]
    decision = decide(the_job, pending, workers, ALL, NOW, SETTINGS)
    # A resize, not a failure: no backoff, no restart counted, the last failure kept.
    assert decision.status.phase is Phase.RESTARTING and decision.status.restarts == 1 and decision.status.gang == 1
    assert decision.status.restart_after == timestamp(NOW) and decision.status.last_failure is None
    assert decision.status.size.next_min_workers == 3
    [event] = decision.events
    assert (event.type, event.reason) == ("Warning", "GangResized")
    assert event.message.startswith("1 of 4 workers unschedulable for 121 s while 3 held their nodes (gang scheduling timeout 120 s): the gang runs with the 3 scheduled")
    after, pods = created(the_job, decision.status)
    assert len(pods) == 3
    assert [e.message for e in after.events if e.reason == "Resized"] == [
        "running 3 of 4 workers: 1 stayed unschedulable for the gang scheduling timeout (120 s)"
    ]
    # Fewer scheduled than minReplicas: released and retried whole, as without minReplicas.
    few = [worker(0, WorkerState.RUNNING, scheduled=True, created=made)] + [
        worker(i, WorkerState.PENDING, pending_reason="Unschedulable", created=made) for i in range(1, 4)
    ]
    released = decide(the_job, pending, few, ALL, NOW, SETTINGS)
    assert released.status.restarts == 2 and released.status.last_failure.reason == "GangUnschedulable"


def test_a_later_restart_asks_for_the_whole_gang_again():
    """The scheduler is asked for every worker; R-Storm places as many as fit, from the gang before up."""
    shrunk = {"reason": "demo-worker-3 (NodeLost) was lost"}
    fewer = [{"type": "Resized", "status": "True", "reason": "FewerWorkers", "lastTransitionTime": timestamp(NOW)}]
    for by, the_job in (("Scheduler", job(workers=ELASTIC, **BY_SCHEDULER)), ("RStorm", job(workers=ELASTIC))):
        running, workers = running_gang(3, by=by, size=shrunk, conditions=fewer)
        workers[0] = worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1)
        crashed = decide(the_job, running, workers, ALL, NOW, SETTINGS)
        assert crashed.status.phase is Phase.RESTARTING
        later = NOW + timedelta(seconds=11)
        if by == "Scheduler":
            assert crashed.status.size.next_min_workers == 4
            _, pods = created(the_job, crashed.status)
            assert len(pods) == 4 and {env(pod)["HOROVOD_SIZE"] for pod in pods} == {"4"}
        else:
            assert crashed.status.size.next_min_workers == 3
            asked = decide(the_job, crashed.status, [], ALL, later, SETTINGS)
            [place] = reads_of(asked, PlaceGang)
            assert (place.min_workers, place.replicas) == (3, 4)
            grown = decide(the_job, record_placement(asked, the_job, Placed(workers=tuple(ON)), later, SETTINGS).status, [], ALL, later, SETTINGS)
            assert len(actions_of(grown, CreatePods)[0].manifests) == 4
            assert [(e.type, e.message) for e in grown.events if e.reason == "Resized"] == [("Normal", "running all 4 workers again")]
            assert (resized(grown).status, resized(grown).reason) == ("False", "AllWorkers")
            assert grown.status.size.reason == "" and grown.status.size.next_look is None


def test_a_shrunk_gang_looks_for_room_and_grows_after_its_next_checkpoint():
    the_job = job(workers=ELASTIC, checkpoint={"path": "/ckpt", "intervalSteps": 100})
    look = timestamp(NOW + timedelta(seconds=30))
    running, workers = running_gang(3, by="RStorm", size={"next_look": look}, progress={"step": 150, "checkpointStep": 100})
    assert not reads_of(decide(the_job, running, workers, ALL, NOW, SETTINGS), PlaceGang)
    due = NOW + timedelta(seconds=30)
    looking = decide(the_job, running, workers, ALL, due, SETTINGS)
    [place] = reads_of(looking, PlaceGang)
    assert (place.min_workers, place.replicas, place.growing) == (4, 4, True)
    assert looking.status.size.next_look == timestamp(due + timedelta(seconds=120))
    # No room, or room short of CPU: the gang runs on, quietly.
    for outcome in (NoRoom("short of memory"), Placed(workers=tuple(ON), cpu_short=("n3",))):
        quiet = record_room(replace(looking, events=list(looking.events)), the_job, outcome, due, SETTINGS)
        assert quiet.status == looking.status and quiet.events == looking.events == []
    room = record_room(replace(looking, events=list(looking.events)), the_job, Placed(workers=tuple(ON)), due, SETTINGS)
    assert (room.status.size.grow_to, room.status.size.grow_after_step) == (4, 100)
    assert room.status.placement == running.placement  # the running gang's placement stands
    assert [e.message for e in room.events] == ["room for 4 of 4 workers: the gang of 3 restarts with them after its next checkpoint"]
    waiting = decide(the_job, room.status, workers, ALL, due, SETTINGS)
    assert waiting.status.phase is Phase.RUNNING and not reads_of(waiting, PlaceGang)
    checkpointed = room.status.model_copy(update={"progress": room.status.progress.model_copy(update={"step": 203, "checkpoint_step": 200})})
    # A gang finishing writes its last checkpoint at its end: it succeeds, it does not grow.
    done = [worker(index, WorkerState.SUCCEEDED) for index in range(3)]
    assert decide(the_job, checkpointed, done, ALL, due, SETTINGS).status.phase is Phase.SUCCEEDED
    grows = decide(the_job, checkpointed, workers, ALL, due, SETTINGS)
    assert grows.status.phase is Phase.RESTARTING and grows.status.restarts == 0 and grows.status.restart_after == timestamp(due)
    assert [(e.type, e.reason) for e in grows.events] == [("Normal", "GangResized")]
    assert grows.events[0].message.startswith("room for 4 of 4 workers, and a checkpoint at step 200: the gang of 3 grows")
    [place] = reads_of(decide(the_job, grows.status, [], ALL, due, SETTINGS), PlaceGang)
    assert (place.min_workers, place.replicas) == (3, 4)


@pytest.mark.parametrize(
    ("spec", "by"),
    [({"checkpoint": None}, "RStorm"), ({"metrics": {"enabled": False}}, "RStorm"), ({}, "Scheduler")],
    ids=["no-checkpoint", "no-metrics", "scheduler"],
)
def test_only_a_checkpointed_gang_rstorm_placed_and_watched_looks_for_room(spec, by):
    """It can grow only at a checkpoint, which the operator learns of from rank 0's metrics; the
    scheduler's room cannot be seen before pods are created."""
    the_job = job(workers=ELASTIC, **{"checkpoint": {"path": "/ckpt"}, **spec})
    running, workers = running_gang(3, by=by, size={"next_look": timestamp(NOW)})
    assert not reads_of(decide(the_job, running, workers, ALL, NOW, SETTINGS), PlaceGang)


def test_a_resumed_job_asks_for_every_worker_again():
    suspended = status(phase=Phase.SUSPENDED, gang=2, size={"gang": 2, "workers": 2, "nextMinWorkers": 2, "reason": "demo-worker-3 (NodeLost) was lost"})
    resumed = decide(job(workers=ELASTIC, **BY_SCHEDULER), suspended, [], ALL, NOW, SETTINGS)
    [create] = actions_of(resumed, CreatePods)
    assert len(create.manifests) == 4 and resumed.status.size.workers == 4
    assert [e.message for e in resumed.events if e.reason == "Resized"] == ["running all 4 workers again"]


def elastic_gang(**status_fields):
    """A running gang of 4 (down to 2) whose rank 0 said it trains elastic."""
    return running_gang(4, progress={"step": 50, "elastic": True}, **status_fields)


def test_an_elastic_gang_replaces_a_failed_worker_once_and_counts_it():
    running, workers = elastic_gang()
    crashed = worker(3, WorkerState.FAILED, failure_reason="Error", exit_code=1)
    decision = decide(job(workers=ELASTIC), running, [*workers[:3], crashed], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RUNNING and decision.status.restarts == 0
    assert (decision.status.replaced_workers, decision.status.replacing) == (1, ["demo-worker-3"])
    [delete] = actions_of(decision, DeletePods)
    assert delete.names == ["demo-worker-3"]  # its peers go on
    # While its old pod goes and its new one starts: no second count, and its new pod is made.
    going = decide(job(workers=ELASTIC), decision.status, [*workers[:3], replace(crashed, terminating=True)], ALL, NOW, SETTINGS)
    assert going.status.replaced_workers == 1 and not actions_of(going, CreatePods)
    gone = decide(job(workers=ELASTIC), going.status, workers[:3], ALL, NOW, SETTINGS)
    [create] = actions_of(gone, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-3"]
    assert create.manifests[0]["metadata"]["labels"]["caramel.dev/gang"] == "0"  # the same gang
    # The replacement itself fails: a new failure, counted again.
    later = NOW + timedelta(minutes=1)
    again = replace(crashed, created=timestamp(later))
    decision = decide(job(workers=ELASTIC), gone.status, [*workers[:3], again], ALL, later, SETTINGS)
    assert decision.status.replaced_workers == 2


@pytest.mark.parametrize(
    ("lost", "why"),
    [((0,), "worker 0 serves the rendezvous"), ((1, 2, 3), "fewer than minReplicas would remain")],
)
def test_an_elastic_gang_restarts_whole_where_it_cannot_go_on(lost, why):
    running, workers = elastic_gang()
    failed = [worker(index, WorkerState.FAILED, failure_reason="Error", exit_code=1) if index in lost else w for index, w in enumerate(workers)]
    decision = decide(job(workers=ELASTIC), running, failed, ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING, why
    assert decision.status.replaced_workers == 0


def test_an_elastic_gangs_replacements_count_against_the_backoff_limit():
    running, workers = elastic_gang(restarts=1, replaced_workers=2)
    crashed = worker(3, WorkerState.FAILED, failure_reason="Error", exit_code=1)
    decision = decide(job(workers=ELASTIC), running, [*workers[:3], crashed], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED  # 1 restart and 2 replacements: backoffLimit 3 reached


def test_a_gang_that_never_said_it_trains_elastic_restarts_whole():
    running, workers = running_gang(4, progress={"step": 50})
    crashed = worker(3, WorkerState.FAILED, failure_reason="Error", exit_code=1)
    decision = decide(job(workers=ELASTIC), running, [*workers[:3], crashed], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING


# -- a script's own error (caramel.contract.restart's fails_at_once) -----------------------------

SCRIPT_BUG = "ValueError: learning_rate must be positive, got -0.1"


def raised(index, before_first_step=False, ago=1.0, error=SCRIPT_BUG):
    """Worker `index` failed as its summary says a script that raised does (`before_first_step`:
    the word of rank 0's worker that rank 0 had reported no step)."""
    at = NOW - timedelta(seconds=ago)
    message = failure_message(f"rank {index} exited with code 1", at, [f"rank {index} | {error}"], [], ScriptRaised(before_first_step))
    return worker(index, WorkerState.FAILED, failure_reason="Error", exit_code=1, failure_cause=failure_cause(message),
                  failure_message=message, failed_at=at)  # fmt: skip


def test_a_script_that_raised_on_every_rank_before_the_first_step_fails_the_job_at_once_quoting_the_error():
    """An unchanged Horovod Keras script raised a ValueError on every rank before its first step,
    and was restarted three times, waiting 10 s, 20 s and 40 s, to raise it again."""
    decision = decide(job(), status(phase=Phase.RUNNING), [raised(0, before_first_step=True, ago=0.9), raised(1)], ALL, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED and decision.status.restarts == 0
    [failed] = [c for c in decision.status.conditions if c.type == "Failed"]
    assert failed.reason == "ScriptError"
    assert decision.status.message == (
        f"worker demo-worker-1 failed: Error, exit code 1: rank 1 | {SCRIPT_BUG}; demo-worker-0 (Error, exit code 1) failed after it; "
        "the script raised before rank 0's first step, as it would at every restart: the job fails without restarting "
        "(spec.runPolicy.restartOnScriptError: true restarts it)"
    )
    assert decision.status.last_failure.worker == "demo-worker-1" and decision.status.last_failure.cause == f"rank 1 | {SCRIPT_BUG}"
    assert [event.reason for event in decision.events] == ["ScriptError"]
    assert not actions_of(decision, CreatePods)


def test_restart_on_script_error_restarts_it_as_any_failure():
    decision = decide(job(runPolicy={"restartOnScriptError": True}), status(phase=Phase.RUNNING),
                      [raised(0, before_first_step=True), raised(1)], ALL, NOW, SETTINGS)  # fmt: skip
    assert decision.status.phase is Phase.RESTARTING and decision.status.restarts == 1


def test_a_script_error_waits_a_moment_for_worker_0_to_say_whether_rank_0_did_a_step():
    """Only rank 0 reports its steps: a raise on worker 1 fails the job only on worker 0's word."""
    waiting = decide(job(), status(phase=Phase.RUNNING), [worker(0), raised(1, ago=1)], ALL, NOW, SETTINGS)
    assert waiting.status.phase is Phase.RUNNING and not waiting.actions and not waiting.events
    said = decide(job(), waiting.status, [raised(0, before_first_step=True, ago=0.5), raised(1, ago=1)], ALL, NOW, SETTINGS)
    assert said.status.phase is Phase.FAILED
    silent = decide(job(), waiting.status, [worker(0), raised(1, ago=SCRIPT_ERROR_WAIT_SECONDS)], ALL, NOW, SETTINGS)
    assert silent.status.phase is Phase.RESTARTING  # worker 0 runs on: rank 0 may well have trained


def test_a_failure_other_than_the_scripts_own_raise_before_the_first_step_restarts():
    after_steps = decide(job(), status(phase=Phase.RUNNING), [raised(0, before_first_step=False), raised(1)], ALL, NOW, SETTINGS)
    peer = worker(0, WorkerState.FAILED, failure_reason="Error", exit_code=1, failure_message="rank 0 exited with code 1\n"
                  "rank 0 | RuntimeError: Connection reset by peer", failed_at=NOW)  # fmt: skip
    followed_by_a_peer = decide(job(), status(phase=Phase.RUNNING), [peer, raised(1)], ALL, NOW, SETTINGS)
    lost = worker(1, WorkerState.FAILED, failure_reason="NodeLost")
    with_a_lost_worker = decide(job(workers={"replicas": 3}), status(phase=Phase.RUNNING),
                                [raised(0, before_first_step=True), lost, worker(2)], ALL, NOW, SETTINGS)  # fmt: skip
    for decision in (after_steps, followed_by_a_peer, with_a_lost_worker):
        assert decision.status.phase is Phase.RESTARTING, decision.status.message


def test_an_elastic_gang_waits_for_worker_0_then_replaces_a_worker_whose_script_raised():
    running, workers = elastic_gang()
    waiting = decide(job(workers=ELASTIC), running, [*workers[:3], raised(3, ago=1)], ALL, NOW, SETTINGS)
    assert waiting.status.phase is Phase.RUNNING and not waiting.actions
    later = decide(job(workers=ELASTIC), running, [*workers[:3], raised(3, ago=SCRIPT_ERROR_WAIT_SECONDS)], ALL, NOW, SETTINGS)
    assert later.status.phase is Phase.RUNNING and later.status.replacing == ["demo-worker-3"]


# -- what a pass asks to be read (Pass.reads), and decides from once read ---------------------


@pytest.mark.parametrize(
    ("spec", "last", "workers", "asks"),
    [
        (VOLCANO, status(), [], True),
        (VOLCANO, status(phase=Phase.PENDING), [worker(0, WorkerState.PENDING)], False),
        ({"runPolicy": {**VOLCANO["runPolicy"], "suspend": True}}, status(phase=Phase.RUNNING), [worker(0), worker(1)], False),
        (VOLCANO, status(phase=Phase.SUCCEEDED, completion_time=timestamp(NOW)), [], False),
        ({"runPolicy": {"schedulingPolicy": {"queue": "research"}}}, status(), [], False),
    ],
    ids=["new-gang", "gang-created", "suspended", "finished", "kueue"],
)
def test_decide_asks_for_the_group_exactly_when_the_gang_waits_for_admission(spec, last, workers, asks):
    decision = decide(job(**spec), last, workers, ALL, NOW, SETTINGS)
    assert decision.reads == ([ReadGroup(PODGROUPS, "demo-gang-0", 0)] if asks else [])


def test_a_resumed_volcano_gang_asks_for_its_new_group_in_the_pass_that_resumes_it():
    """The handler guessed from the status before the pass whether to read the group: a gang new
    in the pass (resumed, restarted) went unread, and its group came a pass later."""
    resumed = decide(job(**VOLCANO), status(phase=Phase.SUSPENDED), [], ALL, NOW, SETTINGS)
    assert resumed.status.gang == 1 and resumed.reads == [ReadGroup(PODGROUPS, "demo-gang-1", 1)]
    read = decide(job(**VOLCANO), status(phase=Phase.SUSPENDED), [], ALL, NOW, SETTINGS, ObservedGroup(1))
    assert not read.reads and [a.manifest["metadata"]["name"] for a in actions_of(read, CreateGroup)] == ["demo-gang-1"]


def test_decide_asks_for_rank_0s_progress_while_the_gang_runs_and_copies_it_once_read():
    with_ip = [worker(0, pod_ip="10.0.0.7"), worker(1)]
    running = status(phase=Phase.RUNNING, start_time=timestamp(NOW), tuning=Tuning(bucket_bytes=4096))
    asked = decide(job(), running, with_ip, ALL, NOW, SETTINGS)
    assert asked.reads == [ReadProgress("10.0.0.7", job().spec.metrics.port)]
    assert not reads_of(decide(job(metrics={"enabled": False}), running, with_ip, ALL, NOW, SETTINGS), ReadProgress)
    assert not reads_of(decide(job(), running, [worker(0), worker(1)], ALL, NOW, SETTINGS), ReadProgress)  # no address yet
    progress = TrainingProgress(step=7, update_time=timestamp(NOW))
    read = lifecycle.decide(Observed(job(), running, with_ip, ALL, NOW, SETTINGS, progress=progress))
    assert read.status.progress == progress and read.status.tuning == Tuning(bucket_bytes=4096)  # the tuning kept
    tuned = lifecycle.decide(Observed(job(), running, with_ip, ALL, NOW, SETTINGS, progress=progress, tuning=Tuning(bucket_bytes=1)))
    assert tuned.status.tuning == Tuning(bucket_bytes=1)
