"""The gang lifecycle state machine, without a cluster: every transition from a status and pods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from caramel.job.api import CaramelJobStatus, Phase, Tuning
from caramel.job.jobfile import parse_job
from caramel_operator.config import OperatorSettings
from caramel_operator.lifecycle import (
    CreatePods,
    CreateService,
    DeleteJob,
    DeletePods,
    decide,
    reject_invalid,
    status_from,
    timestamp,
)
from caramel_operator.observe import WorkerObservation, WorkerState

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=60)


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


def test_a_new_job_gets_its_service_and_whole_gang():
    decision = decide(job(), status(), [], service_exists=False, now=NOW, settings=SETTINGS)
    assert actions_of(decision, CreateService)
    [create] = actions_of(decision, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-0", "demo-worker-1"]
    assert decision.status.phase is Phase.PENDING
    assert decision.status.conditions[0].type == "Created"


def test_only_missing_pods_are_created_while_pending():
    decision = decide(job(), status(), [worker(0, WorkerState.PENDING)], True, NOW, SETTINGS)
    [create] = actions_of(decision, CreatePods)
    assert [pod["metadata"]["name"] for pod in create.manifests] == ["demo-worker-1"]


def test_all_running_is_running_with_a_start_time():
    decision = decide(job(), status(), [worker(0), worker(1)], True, NOW, SETTINGS)
    assert decision.status.phase is Phase.RUNNING
    assert decision.status.start_time == timestamp(NOW)
    assert decision.status.ready_workers == "2/2"
    assert decision.transitions == [Phase.RUNNING]


def test_all_succeeded_is_succeeded_and_keeps_finished_pods_by_default():
    decision = decide(
        job(), status(phase=Phase.RUNNING), [worker(0, WorkerState.SUCCEEDED), worker(1, WorkerState.SUCCEEDED)], True, NOW, SETTINGS
    )
    assert decision.status.phase is Phase.SUCCEEDED
    assert decision.status.completion_time == timestamp(NOW)
    assert not actions_of(decision, DeletePods)


def test_a_failure_restarts_the_gang_with_exponential_backoff():
    failed = worker(1, WorkerState.FAILED, failure_reason="Error", exit_code=3)
    decision = decide(job(), status(phase=Phase.RUNNING, restarts=2), [worker(0), failed], True, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING
    assert decision.status.restarts == 3 and decision.status.gang == 1
    assert decision.status.restart_after == timestamp(NOW + timedelta(seconds=40))  # 10 s x 2^2
    assert decision.status.last_failure.exit_code == 3
    [delete] = actions_of(decision, DeletePods)
    assert sorted(delete.names) == ["demo-worker-0", "demo-worker-1"]
    assert "restarting the whole gang (3 of 3) in 40 s" in decision.status.message


def test_backoff_is_capped():
    assert SETTINGS.restart_backoff(10) == 60


def test_the_new_gang_waits_for_the_backoff_and_for_the_old_pods_to_go():
    restarting = status(phase=Phase.RESTARTING, gang=1, restarts=1, restart_after=timestamp(NOW + timedelta(seconds=5)))
    waiting = decide(job(), restarting, [], True, NOW, SETTINGS)
    assert not actions_of(waiting, CreatePods)
    later = NOW + timedelta(seconds=6)
    old_pod_terminating = decide(job(), restarting, [worker(0, gang=0, terminating=True)], True, later, SETTINGS)
    assert not actions_of(old_pod_terminating, CreatePods)
    ready = decide(job(), restarting.model_copy(update={"tuning": Tuning(bucket_bytes=4096)}), [], True, later, SETTINGS)
    [create] = actions_of(ready, CreatePods)
    assert all(pod["metadata"]["labels"]["caramel.dev/gang"] == "1" for pod in create.manifests)
    env = {e["name"]: e["value"] for e in create.manifests[0]["spec"]["containers"][0]["env"]}
    assert env["CARAMEL_TUNING"] == '{"bucketBytes":4096,"alphaSeconds":null,"betaSecondsPerByte":null}'


def test_backoff_limit_reached_fails_with_the_workers_reason():
    failed = worker(0, WorkerState.FAILED, failure_reason="OOMKilled", exit_code=137)
    decision = decide(job(runPolicy={"backoffLimit": 1}), status(phase=Phase.RUNNING, restarts=1), [failed, worker(1)], True, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    failed_condition = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed_condition.reason == "BackoffLimitExceeded"
    assert failed_condition.message.startswith("worker demo-worker-0 failed: OOMKilled, exit code 137")
    [delete] = actions_of(decision, DeletePods)
    assert delete.names == ["demo-worker-1"]  # cleanPodPolicy Running: the failed pod and its log stay


@pytest.mark.parametrize(("policy", "deleted"), [("None", []), ("Running", ["demo-worker-1"]), ("All", ["demo-worker-0", "demo-worker-1"])])
def test_clean_pod_policy(policy, deleted):
    workers = [worker(0, WorkerState.FAILED, failure_reason="Error"), worker(1)]
    decision = decide(job(runPolicy={"cleanPodPolicy": policy}), status(phase=Phase.FAILED), workers, True, NOW, SETTINGS)
    assert sorted(name for action in actions_of(decision, DeletePods) for name in action.names) == deleted


def test_a_deleted_pod_of_a_running_gang_is_a_failure():
    decision = decide(job(), status(phase=Phase.RUNNING), [worker(0)], True, NOW, SETTINGS)
    assert decision.status.last_failure.reason == "PodDeleted"
    assert decision.status.last_failure.worker == "demo-worker-1"
    assert decision.status.phase is Phase.RESTARTING


def test_a_lost_node_restarts_and_force_deletes_its_pod():
    lost = worker(1, WorkerState.FAILED, failure_reason="NodeLost")
    decision = decide(job(), status(phase=Phase.RUNNING), [worker(0), lost], True, NOW, SETTINGS)
    assert decision.status.phase is Phase.RESTARTING
    forced = [a for a in actions_of(decision, DeletePods) if a.force]
    assert forced and forced[0].names == ["demo-worker-1"]


def test_deadline_fails_the_job():
    started = status(phase=Phase.RUNNING, start_time=timestamp(NOW - timedelta(seconds=61)))
    decision = decide(job(runPolicy={"activeDeadlineSeconds": 60}), started, [worker(0), worker(1)], True, NOW, SETTINGS)
    assert decision.status.phase is Phase.FAILED
    assert decision.status.conditions[-1].reason == "DeadlineExceeded" or any(
        c.reason == "DeadlineExceeded" for c in decision.status.conditions
    )
    assert sorted(actions_of(decision, DeletePods)[0].names) == ["demo-worker-0", "demo-worker-1"]


def test_ttl_deletes_the_finished_job_only_when_due():
    finished = status(phase=Phase.SUCCEEDED, completion_time=timestamp(NOW - timedelta(seconds=30)))
    assert not actions_of(decide(job(runPolicy={"ttlSecondsAfterFinished": 60}), finished, [], True, NOW, SETTINGS), DeleteJob)
    assert actions_of(decide(job(runPolicy={"ttlSecondsAfterFinished": 10}), finished, [], True, NOW, SETTINGS), DeleteJob)


def test_suspend_and_resume():
    suspended = decide(job(runPolicy={"suspend": True}), status(phase=Phase.RUNNING), [worker(0), worker(1)], True, NOW, SETTINGS)
    assert suspended.status.phase is Phase.SUSPENDED
    assert sorted(actions_of(suspended, DeletePods)[0].names) == ["demo-worker-0", "demo-worker-1"]
    resumed = decide(job(), suspended.status, [], True, NOW, SETTINGS)
    assert resumed.status.phase is Phase.PENDING and resumed.status.gang == 1
    assert actions_of(resumed, CreatePods)


def test_pending_reason_is_reported_once():
    stuck = worker(1, WorkerState.PENDING, pending_reason="Unschedulable", pending_message="0/3 nodes are available")
    first = decide(job(), status(), [worker(0), stuck], True, NOW, SETTINGS)
    assert first.status.message == "demo-worker-1 is pending: Unschedulable: 0/3 nodes are available"
    assert [e.reason for e in first.events] == ["Unschedulable"]
    again = decide(job(), first.status, [worker(0), stuck], True, NOW, SETTINGS)
    assert again.events == []


def test_condition_transition_time_moves_only_on_change():
    running = decide(job(), status(), [worker(0), worker(1)], True, NOW, SETTINGS).status
    later = decide(job(), running, [worker(0), worker(1)], True, NOW + timedelta(minutes=5), SETTINGS).status
    assert later.conditions == running.conditions


def test_invalid_spec_fails_once_and_creates_nothing():
    decision = reject_invalid(status(), "spec.workers.replicas: too small", NOW)
    assert decision.status.phase is Phase.FAILED and decision.actions == []
    assert decision.status.conditions[0].reason == "InvalidSpec"
    assert reject_invalid(decision.status, "same", NOW).events == []


def test_status_from_ignores_foreign_keys():
    assert status_from({"phase": "Running", "kopf": {"progress": {}}}).phase is Phase.RUNNING
    assert status_from(None) == CaramelJobStatus()
