"""Gang schedulers, end to end against the Kubernetes API emulator (kmock, testbed/kube_emulator.py),
which stands in for kube-apiserver: it serves Volcano's PodGroup CRD where a test creates it, and
the test plays Volcano's scheduler (it moves the PodGroup's phase) and the kubelets (pod status).
What this cannot show: that Volcano itself admits and schedules the gang (tests/cluster does, on a
cluster with Volcano)."""

from __future__ import annotations

import time

from testbed.operator_harness import CRDS, JOBS, PODGROUP_CRD, Operator, eventually, terminated

SPEC = {
    "script": "examples/train_small.py",
    "workers": {"replicas": 3},
    "runPolicy": {"schedulingPolicy": {"gangScheduler": "Volcano", "queue": "training"}},
}


def test_a_volcano_gang_waits_for_its_podgroup_to_be_admitted_then_runs(emulator, tmp_path):
    api = emulator.api
    with Operator(emulator, tmp_path):
        api.create(CRDS, PODGROUP_CRD)
        job = api.create_job("demo", SPEC)
        group = eventually(lambda: api.podgroup("demo-gang-0"), what="the gang's PodGroup")
        assert group["spec"] == {"minMember": 3, "queue": "training"}
        [owner] = group["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("CaramelJob", job["metadata"]["uid"])
        message = "waiting for Volcano to admit PodGroup demo-gang-0, a gang of 3 workers"
        eventually(lambda: api.status("demo").get("message") == message, what="the wait said")
        eventually(lambda: api.events("WaitingForAdmission"), what="an Event saying so")

        api.set_podgroup_phase("demo-gang-0", "Pending")  # Volcano's queue has no room yet
        eventually(lambda: api.status("demo").get("message", "").endswith("(phase Pending)"), what="the phase said")
        time.sleep(1.0)  # passes every 0.3 s: none creates a pod of a gang not admitted
        assert api.pods("demo") == [] and api.status("demo")["phase"] == "Pending"

        api.set_podgroup_phase("demo-gang-0", "Inqueue")
        pods = eventually(lambda: len(api.pods("demo")) == 3 and api.pods("demo"), what="the admitted gang's pods")
        for pod in pods:
            assert pod["spec"]["schedulerName"] == "volcano"
            assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "demo-gang-0"
            assert "affinity" not in pod["spec"]  # Volcano places the gang (Auto)
        assert api.status("demo")["placement"]["by"] == "Volcano"
        api.run_pods("demo")
        eventually(lambda: api.status("demo").get("phase") == "Running", what="the gang running")

        # A restart: the gone gang's PodGroup is deleted, the new gang gets its own and waits for it.
        api.set_pod_status("demo-worker-2", terminated(1))
        eventually(lambda: api.podgroup("demo-gang-0") is None, what="the old gang's PodGroup deleted")
        eventually(lambda: api.podgroup("demo-gang-1"), what="the new gang's PodGroup")
        eventually(lambda: api.pods("demo") == [], what="the old gang gone")
        api.set_podgroup_phase("demo-gang-1", "Inqueue")
        eventually(lambda: [p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in api.pods("demo")] == ["demo-gang-1"] * 3, what="the new gang's pods")

        # The garbage collector (emulated) deletes the PodGroup with its job.
        api.delete(f"{JOBS}/demo")
        eventually(lambda: api.podgroup("demo-gang-1") is None, what="the PodGroup gone with its job")


def test_a_volcano_job_where_the_api_serves_no_podgroups_fails_saying_what_to_install(emulator, tmp_path):
    with Operator(emulator, tmp_path):
        api = emulator.api
        api.create_job("demo", SPEC)
        eventually(lambda: api.status("demo").get("phase") == "Failed", what="the job failed")
        status = api.status("demo")
        [failed] = [c for c in status["conditions"] if c["type"] == "Failed"]
        assert failed["reason"] == "GangSchedulerMissing"
        assert failed["message"].startswith("spec.runPolicy.schedulingPolicy.gangScheduler Volcano: the API server does not serve podgroups")
        assert "install Volcano" in failed["message"]
        [event] = eventually(lambda: api.events("GangSchedulerMissing"), what="a Warning Event")
        assert event["type"] == "Warning"
        assert api.pods("demo") == []
