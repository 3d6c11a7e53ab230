"""The permissions the operator declares (caramel_operator.cluster) are the ones it uses: every
request the operator process makes to the Kubernetes API emulator, through a job's whole life and
its CRD's deletion, is recorded as (API group, resource, verb), and the set must equal what the
code declares, which tests/deploy/test_chart.py checks every RBAC variant grants exactly.

What this cannot show: the emulator enforces no RBAC (tests/cluster asks a real API server with
`kubectl auth can-i`); a request the operator makes only on a path this run does not take would
be missed, so it goes through creation, placement, a failure and restart, success, the TTL's
deletion, the probes, a Volcano gang's PodGroup (created, read, deleted at a restart) and the
CRD's deletion; and an operator confined to namespaces cannot run
against the emulator (kmock 0.8 cannot parse the path /api/v1/namespaces, which kopf then lists),
so what it reads besides, NAMESPACE_READS, is declared and granted but not observed here.
"""

from __future__ import annotations

import json

from caramel_operator.rbac import CRD_READS, PERMISSIONS, PLACEMENT_READS
from testbed.operator_harness import CRDS, PODGROUP_CRD, Emulator, Operator, eventually, terminated

SPEC = {"script": "examples/train_small.py", "workers": {"replicas": 2}, "runPolicy": {"ttlSecondsAfterFinished": 0}}
VOLCANO = {**SPEC, "runPolicy": {"schedulingPolicy": {"gangScheduler": "Volcano", "queue": "default"}}}
# The operator's two clients: kopf's and the kubernetes package's (the test's own requests, and
# the emulator's creation of the CRD, are not the operator's).
OPERATOR_CLIENTS = ("kopf/", "OpenAPI-Generator/")


def used(record) -> set[tuple[str, str, str]]:
    requests = [json.loads(line) for line in record.read_text().splitlines()]
    assert any(r["agent"].startswith(OPERATOR_CLIENTS[1]) for r in requests), "the operator's own calls were recorded"
    return {(r["group"], r["resource"], r["verb"]) for r in requests if r["agent"].startswith(OPERATOR_CLIENTS)}


def live_a_job(emulator: Emulator, operator: Operator) -> None:
    """A job created, placed, failed once, restarted, succeeded and deleted by its TTL; probes; a
    Volcano job whose gang is admitted, fails and restarts; then a job left for the CRD's deletion
    to release."""
    api = emulator.api
    api.running_job("demo", SPEC)
    api.set_pod_status("demo-worker-1", terminated(1))
    eventually(lambda: [p["metadata"]["labels"]["caramel.dev/gang"] for p in api.pods("demo")] == ["1", "1"], what="a new gang")
    for pod in api.pods("demo"):
        api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
    eventually(lambda: api.job("demo") is None, what="the job deleted after its TTL")
    assert operator.healthy() and operator.ready()
    api.create(CRDS, PODGROUP_CRD)
    api.create_job("volcano", VOLCANO)
    eventually(lambda: api.podgroup("volcano-gang-0"), what="the Volcano gang's PodGroup")
    api.set_podgroup_phase("volcano-gang-0", "Inqueue")
    eventually(lambda: len(api.pods("volcano")) == 2, what="the admitted gang's pods")
    api.set_pod_status("volcano-worker-0", terminated(1))
    eventually(lambda: api.podgroup("volcano-gang-0") is None, what="the restarted gang's PodGroup deleted")
    api.create_job("left", SPEC)
    eventually(lambda: len(api.pods("left")) == 2, what="the second job's pods")
    api.delete_crd()


def test_the_operator_uses_exactly_the_permissions_it_declares(tmp_path):
    record = tmp_path / "requests.jsonl"
    emulator = Emulator(tmp_path, record=record)
    operator = Operator(emulator, tmp_path)
    try:
        live_a_job(emulator, operator)
    finally:
        operator.stop()
        emulator.stop()
    # Served cluster-wide, it reads CRDs and (for placement) nodes at cluster scope too.
    assert used(record) == PERMISSIONS | PLACEMENT_READS | CRD_READS

