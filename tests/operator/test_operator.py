"""The operator's handlers against a real HTTP Kubernetes API (kmock's emulator)."""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import UTC, datetime, timedelta

import pytest

from caramel.contract.api import GangPlacement
from caramel.contract.jobfile import parse_job
from caramel.contract.termination import failure_message
from caramel.metrics import PlanRecord, WorkerMetrics
from caramel.network.labels import ClusterLinks
from caramel.planner.timing import StepTimes, TransferTiming
from conftest import free_port
from caramel_operator.builders import build_worker_pod
from caramel_operator.gang_placement import placed_topology
from caramel_operator.handlers import FINALIZER
from testbed.operator_harness import CRD, CRDS, EVENTS, JOBS, NETWORK_POLICIES, SERVICES, Operator, Watch, eventually, printer_row, terminated

SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"], "workers": {"replicas": 2}}


@pytest.fixture
def operator(emulator, tmp_path):
    operator = Operator(emulator, tmp_path)
    yield operator
    operator.stop()


def phase(api, name):
    return api.status(name).get("phase")


def condition_types(obj):
    return {condition["type"] for condition in ((obj or {}).get("status") or {}).get("conditions") or []}


def test_create_runs_the_gang_to_success(emulator, operator):
    api = emulator.api
    job = api.create_job("demo", SPEC)
    pods = eventually(lambda: len(api.pods("demo")) == 2 and api.pods("demo"), what="two worker pods")
    assert api.get(f"{SERVICES}/demo")["spec"]["clusterIP"] == "None"

    # Placed by R-Storm (the default) on the emulator's nodes, each pod pinned to its node.
    placement = GangPlacement.model_validate(api.status("demo")["placement"])
    topology = placed_topology(placement.workers, 1, ClusterLinks())
    expected = [
        build_worker_pod(parse_job(job), index, default_image="caramel:test", node=worker.node, topology=topology)
        for index, worker in enumerate(placement.workers)
    ]
    for pod, want in zip(pods, expected, strict=True):
        assert pod["metadata"]["name"] == want["metadata"]["name"]
        assert pod["spec"]["containers"][0]["env"] == want["spec"]["containers"][0]["env"]
        assert pod["spec"]["affinity"] == want["spec"]["affinity"]
        assert pod["spec"]["containers"][0]["command"] == want["spec"]["containers"][0]["command"]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    status = eventually(lambda: api.status("demo").get("conditions") and api.status("demo"), what="a status")
    assert status["phase"] == "Pending"
    assert any(c["type"] == "Created" and c["status"] == "True" for c in status["conditions"])

    api.run_pods("demo")
    eventually(lambda: phase(api, "demo") == "Running", what="phase Running")
    assert api.status("demo")["readyWorkers"] == "2/2"
    for pod in api.pods("demo"):
        api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
    eventually(lambda: phase(api, "demo") == "Succeeded", what="phase Succeeded")
    status = api.status("demo")
    assert status["completionTime"] and status["startTime"]
    assert len(api.pods("demo")) == 2  # cleanPodPolicy Running keeps finished pods and their logs
    assert "caramel_operator_jobs_succeeded_total 1.0" in operator.metrics()


def test_a_failed_worker_restarts_the_whole_gang(emulator, operator):
    api = emulator.api
    api.running_job("demo", SPEC)

    api.set_pod_status("demo-worker-1", terminated(137, reason="OOMKilled"))
    eventually(lambda: api.status("demo").get("restarts") == 1, what="a restart")
    eventually(
        lambda: [p["metadata"]["labels"]["caramel.dev/gang"] for p in api.pods("demo")] == ["1", "1"],
        what="a new gang of two pods",
    )
    status = api.status("demo")
    assert status["lastFailure"] == {"worker": "demo-worker-1", "reason": "OOMKilled", "exitCode": 137, "cause": "", "message": ""}
    assert any(c["type"] == "Restarting" and c["status"] == "True" for c in status["conditions"])
    eventually(lambda: api.events("WorkerFailed"), what="a Warning event explaining the restart")
    api.run_pods("demo")
    eventually(lambda: phase(api, "demo") == "Running", what="the new gang running")
    assert "caramel_operator_jobs_restarted_total 1.0" in operator.metrics()


def test_the_worker_that_failed_first_is_blamed_and_those_that_followed_named(emulator, operator, tmp_path):
    """On v1.36 rank 1 was killed, rank 0 followed within the second with "Connection reset by
    peer", and the status and Event blamed worker 0, the lowest-numbered, quoting its follow-on
    error. Both fail while no operator runs, so that its first pass sees both."""
    api = emulator.api
    api.running_job("demo", SPEC)
    operator.stop()
    killed_at = datetime(2026, 11, 27, 9, 30, 1, 120000, tzinfo=UTC)
    reset = "rank 0 | Aborting RingReduce with UNAVAILABLE: Connection reset by peer"
    killed = failure_message("rank 1 killed by SIGKILL", killed_at, [], ["rank 1 | step 708"])
    follower = failure_message("rank 0 exited with code 1", killed_at + timedelta(milliseconds=40), [reset], [reset])
    api.set_pod_status("demo-worker-0", terminated(1, message=follower, finished_at="2026-11-27T09:30:01Z"))
    api.set_pod_status("demo-worker-1", terminated(137, message=killed, finished_at="2026-11-27T09:30:01Z"))
    successor = Operator(emulator, tmp_path)
    try:
        eventually(lambda: api.status("demo").get("restarts") == 1, what="a restart")
        assert api.status("demo")["lastFailure"]["worker"] == "demo-worker-1"
        [event] = eventually(lambda: api.events("WorkerFailed"), what="the restart's Event")
        assert event["message"].startswith(
            "worker demo-worker-1 failed: Error, exit code 137: rank 1 killed by SIGKILL; "
            "demo-worker-0 (Error, exit code 1) failed after it; restarting the whole gang"
        ), event["message"]
    finally:
        successor.stop()


def test_exhausted_backoff_fails_the_job_with_the_workers_reason(emulator, operator):
    api = emulator.api
    api.create_job("demo", {**SPEC, "runPolicy": {"backoffLimit": 1}})
    for gang in ("0", "1"):
        eventually(
            lambda: [p["metadata"]["labels"]["caramel.dev/gang"] for p in api.pods("demo")] == [gang, gang],
            what=f"gang {gang}",
        )
        api.run_pods("demo")
        eventually(lambda: phase(api, "demo") == "Running", what=f"gang {gang} running")
        api.set_pod_status("demo-worker-0", terminated(3, message="Traceback ...\nValueError: bad shard"))
    eventually(lambda: phase(api, "demo") == "Failed", what="phase Failed")
    status = api.status("demo")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "worker demo-worker-0 failed: Error, exit code 3: ValueError: bad shard" in failed["message"]
    assert status["lastFailure"]["cause"] == "ValueError: bad shard"
    # The finished job counts no worker as ready, though one still ran when it failed.
    assert status["readyWorkers"] == "0/2" and status["workers"]["running"] == 0 and status["workers"]["failed"] == 1
    # cleanPodPolicy Running deletes the worker still running and keeps the failed one and its log.
    eventually(lambda: [p["metadata"]["name"] for p in api.pods("demo")] == ["demo-worker-0"], what="clean-up")


def test_deleting_the_job_cleans_up(emulator, operator):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2 and api.get(f"{SERVICES}/demo"), what="pods and service")
    api.delete("/apis/caramel.dev/v1alpha1/namespaces/default/carameljobs/demo")
    eventually(lambda: api.job("demo") is None, what="the job gone")
    # The garbage collector (emulated) deletes what the job owns.
    eventually(lambda: api.pods("demo") == [] and api.get(f"{SERVICES}/demo") is None, what="pods and service gone")
    assert api.get(f"{NETWORK_POLICIES}/demo") is None


def test_an_invalid_spec_fails_and_creates_nothing(emulator, operator):
    api = emulator.api
    # The CRD's schema would stop this; the emulator has none, like a cluster whose CRD is outdated.
    api.create_job("demo", {"script": "train.py", "command": ["python"], "workers": {"replicas": 0}})
    eventually(lambda: phase(api, "demo") == "Failed", what="phase Failed")
    failed = next(c for c in api.status("demo")["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.workers.replicas: Input should be greater than or equal to 1 (got 0)" in failed["message"]
    eventually(lambda: api.events("InvalidSpec"), what="an InvalidSpec Event")  # posted after the status is written
    assert api.pods("demo") == [] and api.get(f"{SERVICES}/demo") is None


def test_an_operator_restart_neither_duplicates_nor_orphans_pods(emulator, operator, tmp_path):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    for pod in api.pods("demo"):  # a mark that a re-created pod would not carry
        api.patch(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}", {"metadata": {"annotations": {"test/original": "yes"}}})
    operator.stop()

    successor = Operator(emulator, tmp_path)
    try:
        api.run_pods("demo")
        eventually(lambda: phase(api, "demo") == "Running", what="phase Running under the new operator")
        pods = api.pods("demo")
        assert [p["metadata"]["name"] for p in pods] == ["demo-worker-0", "demo-worker-1"]
        assert all(p["metadata"]["annotations"].get("test/original") == "yes" for p in pods)
        assert api.status("demo")["restarts"] == 0
    finally:
        successor.stop()


def test_pending_workers_say_why(emulator, operator):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    api.set_pod_status(
        "demo-worker-1",
        {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}]},
    )
    message = eventually(lambda: api.status("demo").get("message"), what="a pending message")
    assert message == "demo-worker-1 is pending: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."
    assert eventually(lambda: api.events("Unschedulable"), what="an Unschedulable Event")[0]["message"] == message
    api.set_pod_status(
        "demo-worker-0",
        {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "caramel:test"'}}}]},
    )
    eventually(lambda: "ImagePullFailed" in api.status("demo").get("message", ""), what="an image pull message")
    assert api.status("demo")["message"].startswith("demo-worker-0 is pending (and 1 more workers): ImagePullFailed: ImagePullBackOff")
    eventually(lambda: api.events("ImagePullFailed"), what="an ImagePullFailed Event")


def test_suspend_deletes_the_pods_and_resume_brings_a_new_gang(emulator, operator):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    api.patch("/apis/caramel.dev/v1alpha1/namespaces/default/carameljobs/demo", {"spec": {"runPolicy": {"suspend": True}}})
    eventually(lambda: phase(api, "demo") == "Suspended" and not api.pods("demo"), what="suspended without pods")
    api.patch("/apis/caramel.dev/v1alpha1/namespaces/default/carameljobs/demo", {"spec": {"runPolicy": {"suspend": False}}})
    eventually(
        lambda: [p["metadata"]["labels"]["caramel.dev/gang"] for p in api.pods("demo")] == ["1", "1"], what="a new gang"
    )
    eventually(lambda: phase(api, "demo") == "Pending", what="phase Pending")  # pods land before the status
    suspended = next(c for c in api.status("demo")["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "False" and suspended["reason"] == "Resumed"


def test_ttl_after_finished_deletes_the_job_quietly(emulator, operator):
    api = emulator.api
    # As a real API server may: the deletion's watch event comes before its answer, and stops the
    # daemon that asked for it. Cancelled while it waited, it logged a WARNING every time.
    emulator.stall("DELETE", "/carameljobs/demo$", 1.0, when="after")
    api.create_job("demo", {**SPEC, "runPolicy": {"ttlSecondsAfterFinished": 1, "cleanPodPolicy": "All"}})
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    for pod in api.pods("demo"):
        api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
    eventually(lambda: phase(api, "demo") == "Succeeded", what="phase Succeeded")
    eventually(lambda: api.job("demo") is None, timeout=15, what="the job deleted after its TTL")
    assert api.pods("demo") == []
    eventually(lambda: "CaramelJob default/demo: Expired" in operator.log.read_text(), what="the deletion logged")
    time.sleep(2)  # the deletion answered, and the daemon gone
    assert "WARNING" not in operator.log.read_text() and "cancelled" not in operator.log.read_text()


def test_a_job_deleted_during_its_first_pass_gets_no_pods_and_no_event_saying_so(emulator, operator):
    api = emulator.api
    # The pass's status write is answered late; the job goes meanwhile, before its pods are created.
    emulator.stall("PATCH", "/carameljobs/gone/status$", 2.0, when="after")
    api.create_job("gone", SPEC)
    eventually(lambda: phase(api, "gone") is not None, what="the first pass's status written")
    api.delete(f"{JOBS}/gone")
    api.patch(f"{JOBS}/gone", {"metadata": {"finalizers": []}})
    eventually(lambda: api.job("gone") is None, what="the job gone")
    time.sleep(3)  # the status write answered, and the pass at its end
    assert not api.pods("gone")
    assert "default/gone: GangCreated" not in operator.log.read_text()
    assert not [event for event in api.events("GangCreated") if event["involvedObject"]["name"] == "gone"]


def test_rank0_progress_reaches_the_status_and_its_tuning_survives_a_restart(emulator, operator):
    # Rank 0's real metrics endpoint, fed as the runtime feeds it.
    port = free_port()
    rank0 = WorkerMetrics(rank=0)
    rank0.serve(port)
    rank0.record_plan(PlanRecord(bucket_bytes=8 * 1024 * 1024, alpha_seconds=0.002, beta_seconds_per_byte=1e-9, plan_changes=0, planned=True))
    for step in range(1, 6):
        transfers = tuple(TransferTiming(100_000_000 // 3, 0.05 / 3) for _ in range(3))
        rank0.record_step(step, 0.2, 1.5, StepTimes(transfers, (), 0.05, 0.0, 0.05))

    api = emulator.api
    api.create_job("demo", {**SPEC, "metrics": {"port": port}})
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    api.run_pods("demo", podIP="127.0.0.1")
    progress = eventually(lambda: api.status("demo").get("progress"), what="progress in the status")
    assert progress["step"] == 5 and progress["stepSeconds"] == pytest.approx(0.2)
    assert progress["bandwidth"] == "2.0 GB/s" and progress["loss"] == 1.5
    tuning = {"bucketBytes": 8 * 1024 * 1024, "alphaSeconds": 0.002, "betaSecondsPerByte": 1e-9}
    assert api.status("demo")["tuning"] == tuning
    row = printer_row(api.job("demo"))
    print(f"\nkubectl get cmj -o wide: {row}")
    assert row["Phase"] == "Running" and row["Ready"] == "2/2" and row["Step"] == 5 and row["Bandwidth"] == "2.0 GB/s"

    api.set_pod_status("demo-worker-1", terminated(1))
    pods = eventually(
        lambda: [p for p in api.pods("demo") if p["metadata"]["labels"]["caramel.dev/gang"] == "1"], what="a new gang"
    )
    env = {var["name"]: var["value"] for var in pods[0]["spec"]["containers"][0]["env"]}
    assert json.loads(env["CARAMEL_TUNING"]) == tuning


def test_a_refused_pod_creation_reaches_the_status_and_an_event(emulator, operator):
    """A 403 (here quota admission; Pod Security and webhooks answer alike) was only a traceback
    in the operator's log."""
    api = emulator.api
    api.create("/api/v1/namespaces/default/resourcequotas", {"metadata": {"name": "two-pods", "namespace": "default"}, "spec": {"hard": {"pods": "1"}}})
    api.create_job("demo", SPEC)
    message = eventually(lambda: api.status("demo").get("message"), what="a status message")
    # The two pods are created concurrently: either may be the one refused.
    assert re.match(r"cannot create the job's objects: Pod demo-worker-(\d): pods \"demo-worker-\1\" is forbidden: exceeded quota: two-pods", message), message
    assert eventually(lambda: api.events("FailedCreate"), what="a FailedCreate Event")[0]["message"] == message
    assert len(api.pods("demo")) == 1


def test_invalid_spec_messages_name_the_field_in_the_users_terms(emulator, operator):
    api = emulator.api
    api.create_job("demo", {**SPEC, "workers": {"replicas": 2, "resources": {"requests": {"cpu": "lots"}}}})
    eventually(lambda: phase(api, "demo") == "Failed", what="phase Failed")
    message = api.status("demo")["message"]
    assert message == (
        "invalid spec: spec.workers.resources.requests.cpu: must be a Kubernetes quantity such as 2, 500m or 4Gi, "
        "not negative (got 'lots')"
    )


def test_an_invalid_image_name_fails_the_job(emulator, operator):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    waiting = {"waiting": {"reason": "InvalidImageName", "message": 'Failed to apply default image tag "caramel:Bad Tag"'}}
    api.set_pod_status("demo-worker-0", {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": waiting}]})
    eventually(lambda: phase(api, "demo") == "Failed", what="phase Failed")
    failed = next(c for c in api.status("demo")["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidImage" and "check spec.image" in failed["message"]


def test_the_final_step_is_recorded_and_a_finished_job_leaves_the_timer(emulator, operator):
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    final = "caramel-progress step=200 total=200 loss=0.1489 step_seconds=0.025 examples_per_second=10238 final=1\n"
    api.set_pod_status("demo-worker-0", terminated(0, reason="Completed", message=final))
    api.set_pod_status("demo-worker-1", terminated(0, reason="Completed"))
    eventually(lambda: phase(api, "demo") == "Succeeded", what="phase Succeeded")
    assert api.status("demo")["progress"]["step"] == 200
    assert printer_row(api.job("demo"))["Step"] == 200
    # Off the timer: no more passes, and kopf's finalizer is gone.
    eventually(lambda: not api.job("demo")["metadata"].get("finalizers"), what="the finalizer released")
    passes = operator.metrics().count("caramel_operator_reconcile_duration_seconds_count")
    before = [line for line in operator.metrics().splitlines() if line.startswith("caramel_operator_reconcile_duration_seconds_count")]
    time.sleep(2)
    after = [line for line in operator.metrics().splitlines() if line.startswith("caramel_operator_reconcile_duration_seconds_count")]
    assert passes == 1 and before == after
    assert "Timer 'reconcile' succeeded" not in operator.log.read_text()


def test_a_deleted_and_recreated_crd_releases_jobs_and_serves_new_ones_at_once(emulator, operator):
    api = emulator.api
    api.create_job("old", SPEC)
    eventually(lambda: len(api.pods("old")) == 2, what="the old job's pods")
    # The CRD waits for every job to go; the jobs wait for kopf's finalizer, which the operator releases.
    crd = api.delete_crd()
    eventually(lambda: not api.pods("old"), what="the old job's pods collected")
    api.create(CRDS, crd)
    started = time.monotonic()
    api.create_job("new", SPEC)
    eventually(lambda: len(api.pods("new")) == 2, timeout=30, what="the new job's pods")
    print(f"\nnew job served {time.monotonic() - started:.1f} s after the CRD came back")
    time.sleep(2)
    assert not api.pods("old"), "no pods for a job deleted with its CRD"
    # The CRD's deletion is no error: it once logged a 40-line traceback, each time.
    log = operator.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_a_finalizer_put_back_while_the_crd_terminates_is_released_again(emulator, operator):
    """kopf serves a job a moment after its CRD's deletion began, and may put its finalizer back on
    it after the CRD's last event before the job's deletion; the CRD must go all the same."""
    api = emulator.api
    api.create_job("old", SPEC)
    eventually(lambda: len(api.pods("old")) == 2, what="the old job's pods")
    # The test's own finalizer keeps the job there (the emulator deletes it a second after the CRD
    # turns Terminating) until kopf's has been put back, however late this test runs.
    hold = "test.caramel.dev/hold"
    api.patch(f"{JOBS}/old", {"metadata": {"finalizers": [*api.job("old")["metadata"]["finalizers"], hold]}})
    api.delete(CRD)
    eventually(lambda: "Terminating" in condition_types(api.get(CRD)), what="the CRD Terminating")
    time.sleep(0.3)  # the operator has answered both of the CRD's events (its deletion, its condition)
    put_back = api.patch(f"{JOBS}/old", {"metadata": {"finalizers": [FINALIZER, hold]}})
    assert put_back["metadata"]["finalizers"] == [FINALIZER, hold]
    time.sleep(1)
    finalizers = api.job("old")["metadata"]["finalizers"]
    api.patch(f"{JOBS}/old", {"metadata": {"finalizers": [f for f in finalizers if f != hold]}})
    eventually(lambda: api.get(CRD) is None, timeout=10, what="the CRD gone")
    assert "Traceback" not in operator.log.read_text()


GLOO_ABORT = "\n".join(
    [
        "rank 0 | caramel: restored /ckpt/ckpt-100 at step 100",
        "rank 0 | terminate called after throwing an instance of 'gloo::IoException'",
        "rank 0 |   what():  [horovod/common/gloo/http_store.cc:54] Wait timeout after 30 seconds for key(s): 1. "
        "You may want to increase the timeout via HOROVOD_GLOO_TIMEOUT_SECONDS",
        *(f"rank 0 | [{i}] horovod/common/operations.cc:{i}: frame {i} of the stack" for i in range(12)),
        "rank 0 | See exception message above",
    ]
)


def test_a_failure_keeps_its_cause_and_the_restart_event_its_last_lines(emulator, operator):
    """The status kept the last 400 characters, which for Gloo's abort said only "See exception
    message above"; and the failed pod went with its gang, its log with it."""
    api = emulator.api
    api.running_job("demo", SPEC)
    # The status says why while the job is Restarting, which lasts only until the new gang is
    # created: a moment, here.
    jobs = Watch(api.url, JOBS)
    try:
        api.set_pod_status("demo-worker-0", terminated(134, message=GLOO_ABORT))
        [restarting, *_] = eventually(lambda: jobs.objects(lambda job: (job.get("status") or {}).get("phase") == "Restarting"), what="a restart")
    finally:
        jobs.close()
    failure = restarting["status"]["lastFailure"]
    assert failure["message"] == GLOO_ABORT and len(GLOO_ABORT) > 400
    assert failure["cause"].startswith("rank 0 | terminate called after throwing an instance of 'gloo::IoException' rank 0 |   what():")
    assert "Wait timeout after 30 seconds" in restarting["status"]["message"]
    [event] = eventually(lambda: api.events("WorkerFailed"), what="the restart's Event")
    assert "Wait timeout after 30 seconds" in event["message"] and event["message"].endswith("See exception message above")
    assert len(event["message"]) <= 1024


def pull_fails(api, flip: int) -> None:
    """Play the kubelet of worker 0, failing to pull its image; it flips between two reasons."""
    reason = ("ErrImagePull", "ImagePullBackOff")[flip % 2]
    waiting = {"waiting": {"reason": reason, "message": f'{reason} of "caramel:test" ({flip})'}}
    api.set_pod_status("demo-worker-0", {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": waiting}]})


def test_a_pending_reason_gets_one_event_however_its_detail_flips(emulator, operator):
    """An Event each time the kubelet's reason flipped: 10 in 4 minutes."""
    api = emulator.api
    api.create_job("demo", SPEC)
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    for flip in range(6):
        pull_fails(api, flip)
        eventually(lambda: f"({flip})" in api.status("demo").get("message", ""), what=f"flip {flip} in the status")
    assert len(api.events("ImagePullFailed")) == 1


def test_a_deadline_counts_from_the_start_for_a_gang_that_never_runs(emulator, operator):
    """A gang that never ran (its image could not be pulled) stayed Pending past its deadline,
    holding its pods; and a finished job kept counting its ready workers."""
    api = emulator.api
    api.create_job("demo", {**SPEC, "runPolicy": {"activeDeadlineSeconds": 3}})
    eventually(lambda: len(api.pods("demo")) == 2, what="two worker pods")
    api.set_pod_status("demo-worker-1", {"phase": "Running"})
    pull_fails(api, 0)
    eventually(lambda: phase(api, "demo") == "Failed", what="phase Failed at the deadline")
    status = api.status("demo")
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    assert status["readyWorkers"] == "0/2" and status["workers"]["pending"] == status["workers"]["running"] == 0
    eventually(lambda: not api.pods("demo"), what="the pods deleted")


def test_one_log_line_per_change_none_per_probe_and_events_name_the_operator(emulator, operator):
    api = emulator.api
    api.running_job("demo", SPEC)
    api.set_pod_status("demo-worker-1", terminated(1, message="ValueError: bad shard"))
    eventually(lambda: [p["metadata"]["labels"]["caramel.dev/gang"] for p in api.pods("demo")] == ["1", "1"], what="a new gang")
    for pod in api.pods("demo"):
        api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
    eventually(lambda: phase(api, "demo") == "Succeeded", what="phase Succeeded")
    for _ in range(5):
        assert operator.healthy() and operator.ready()
    time.sleep(1)
    events = [e for e in api.items(EVENTS) if e["involvedObject"]["name"] == "demo"]
    lines = [line for line in operator.log.read_text().splitlines() if "CaramelJob default/demo:" in line]
    assert sorted(line.split("CaramelJob default/demo: ")[1].split(":")[0] for line in lines) == sorted(e["reason"] for e in events)
    assert [e["reason"] for e in events].count("WorkerFailed") == 1
    log = operator.log.read_text()
    assert "/healthz" not in log and "/readyz" not in log and "succeeded." not in log, log
    assert {(e["reportingComponent"], e["source"]["component"], e["reportingInstance"]) for e in events} == {
        ("caramel-operator", "caramel-operator", socket.gethostname())
    }
