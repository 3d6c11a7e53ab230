"""The operator's robustness against a misbehaving API, as a real process against the Kubernetes
API emulator: hung API calls, a watch that delivers nothing, a re-created CRD whose resource
discovery publishes late, an API server too slow to answer the probes.

What the emulator plays (testbed/kube_emulator.py): it holds chosen requests (a hung call, or a
watch that never delivers) and lists a re-created CRD's resource in discovery only after the
CRD's last event. The kubelet is played by the tests: they read the probes, and restart the
operator where liveness fails.
"""

from __future__ import annotations

import time

from testbed.operator_harness import CRDS, Emulator, Operator, eventually, terminated

SPEC = {"script": "examples/train_small.py", "workers": {"replicas": 2}}
# kopf runs the liveness probe's handlers at most this often, answering with their last result in
# between: a lag shows only from a probe's second run after it began.
KOPF_PROBE_SECONDS = 10
# More creations than any asyncio thread pool has threads (min(32, CPUs + 4)): hung without a
# timeout, they would hold every thread the operator's API calls share.
STUCK_REPLICAS = 40
STALL_SECONDS = 2


def operator_of(emulator, tmp_path, **env):
    return Operator(emulator, tmp_path, **env)


def test_a_hung_api_call_does_not_hang_the_reconcile_loop(emulator, tmp_path):
    api = emulator.api
    emulator.stall("POST", "/pods$", 3600, name="^stuck-worker-")
    operator = operator_of(emulator, tmp_path, CARAMEL_API_REQUEST_TIMEOUT_SECONDS="1")
    try:
        api.create_job("stuck", {**SPEC, "workers": {"replicas": STUCK_REPLICAS}, "placement": {"policy": "Scheduler"}})
        eventually(lambda: "Timeout" in operator.log.read_text(), what="the stuck job's creations timing out")
        api.create_job("free", SPEC)
        eventually(lambda: len(api.pods("free")) == 2, timeout=30, what="the other job's pods, while the stuck job's calls hang")
        assert api.pods("stuck") == []
        assert operator.healthy()
    finally:
        operator.stop()


def test_a_watch_that_delivers_nothing_fails_liveness(tmp_path):
    """kopf#1276: a watch can stall unnoticed, and jobs go unserved while /healthz says ok."""
    requests = tmp_path / "requests.jsonl"
    emulator = Emulator(tmp_path, record=requests)
    api = emulator.api
    emulator.stall("GET", "/carameljobs$", 3600, watch=True)
    operator = operator_of(emulator, tmp_path, CARAMEL_WATCH_STALL_SECONDS="2")
    try:
        assert operator.healthy() and operator.ready()  # nothing missed yet
        # Created before kopf's first list, the job would be served by that list, watch or not.
        eventually(lambda: requests.exists() and '"verb": "watch", "group": "caramel.dev"' in requests.read_text(), what="kopf watching CaramelJobs")
        api.create_job("demo", SPEC)
        eventually(lambda: not operator.healthy(), timeout=30, what="liveness failing")
        assert "the watch has not delivered the latest change of CaramelJob default/demo" in operator.log.read_text()
        assert api.pods("demo") == []
    finally:
        operator.stop()
        emulator.stop()


def test_a_recreated_crd_whose_discovery_lags_is_served_after_the_probe_restarts_the_operator(tmp_path):
    """On Kubernetes v1.36, after the CRD was deleted and created again, kopf read the API's
    discovery before it listed the resource again, at the CRD's last event, and never looked
    again: new jobs got no status and no pods for as long as the operator ran."""
    emulator = Emulator(tmp_path, discovery_lag=2.0)
    operator = operator_of(emulator, tmp_path, CARAMEL_WATCH_STALL_SECONDS="2")
    try:
        api = emulator.api
        api.create(CRDS, api.delete_crd())
        eventually(lambda: api.get("/apis/caramel.dev/v1alpha1"), what="discovery listing CaramelJobs again")
        api.create_job("new", SPEC)
        time.sleep(3)
        assert api.pods("new") == [], "the emulator reproduces the lag: kopf resolved the resource before discovery had it"
        started = time.monotonic()
        eventually(lambda: not operator.healthy(), timeout=30, what="liveness failing")
        print(f"\nliveness failed {time.monotonic() - started:.1f} s after the check could first see the job")
        operator.stop()
        operator = operator_of(emulator, tmp_path)  # as the kubelet restarts it
        eventually(lambda: len(api.pods("new")) == 2, timeout=30, what="the new job's pods after the restart")
    finally:
        operator.stop()
        emulator.stop()


def test_readiness_needs_the_api_server_and_liveness_does_not(emulator, tmp_path):
    """An API server too slow to list the jobs makes the operator unready; restarting it (what a
    failed liveness probe does) would not help, so liveness holds."""
    operator = operator_of(emulator, tmp_path)
    try:
        eventually(operator.ready, what="readiness")
        emulator.stall("GET", "/carameljobs$", 30, watch=False)
        eventually(lambda: not operator.ready(), timeout=30, what="unready while the jobs cannot be listed")
        assert operator.healthy()
    finally:
        operator.stop()


def test_a_job_recreated_with_the_name_of_one_deleted_with_its_crd_keeps_liveness(emulator, tmp_path):
    """On Kubernetes v1.36, a job re-created with the namespace and name of one deleted with its
    CRD was served and succeeded, and then /healthz reported the watch ever further behind (9.5,
    26, 36, 46, 56.5 s) until the kubelet restarted the operator: the watch never delivered the
    old job's deletion (kopf stops watching a resource whose CRD is terminating), and its entry,
    keyed by namespace and name, stood for the new job's."""
    api = emulator.api
    operator = operator_of(emulator, tmp_path, CARAMEL_WATCH_STALL_SECONDS=str(STALL_SECONDS))
    try:
        api.create_job("demo", SPEC)
        eventually(lambda: len(api.pods("demo")) == 2, what="the first job's pods")
        crd = api.delete_crd()
        eventually(lambda: not api.pods("demo"), what="the first job's pods collected")
        api.create(CRDS, crd)
        eventually(lambda: api.get("/apis/caramel.dev/v1alpha1"), what="discovery listing CaramelJobs again")
        api.create_job("demo", SPEC)
        eventually(lambda: len(api.pods("demo")) == 2, timeout=30, what="the new job's pods")
        api.run_pods("demo")
        eventually(lambda: api.status("demo").get("phase") == "Running", what="the new job Running")
        for pod in api.pods("demo"):
            api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
        eventually(lambda: api.status("demo").get("phase") == "Succeeded", what="the new job Succeeded")
        watched_until = time.monotonic() + 2 * KOPF_PROBE_SECONDS + 2 * STALL_SECONDS
        while time.monotonic() < watched_until:
            assert operator.healthy(), operator.log.read_text()
            time.sleep(1)
    finally:
        operator.stop()
