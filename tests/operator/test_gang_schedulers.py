"""The gang-scheduler seam (caramel_operator.gang_schedulers): each scheduler's group object, its
pods' decorations and its reading of admission, pure; and how a job chooses one."""

from __future__ import annotations

import pytest

from caramel.contract.api import PlacedBy
from caramel.contract.jobfile import JobFileError, parse_job
from caramel_operator.builders import build_worker_pod
from caramel_operator.gang_placement import placed_by, placement_problems
from caramel_operator.gang_schedulers import KUEUE, NONE, PODGROUPS, VOLCANO, gang_scheduler

VOLCANO_POLICY = {"schedulingPolicy": {"gangScheduler": "Volcano", "queue": "training"}}


def job(**spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo", "namespace": "ml"}, "spec": {"script": "t.py", **spec}}
    )


def test_a_job_chooses_its_gang_scheduler_by_its_scheduling_policy():
    assert gang_scheduler(job()) is NONE
    # A queue alone is Kueue, as before the choice existed.
    assert gang_scheduler(job(runPolicy={"schedulingPolicy": {"queue": "research"}})) is KUEUE
    assert gang_scheduler(job(runPolicy={"schedulingPolicy": {"gangScheduler": "Kueue", "queue": "research"}})) is KUEUE
    assert gang_scheduler(job(runPolicy=VOLCANO_POLICY)) is VOLCANO


def test_an_unknown_gang_scheduler_is_refused_naming_the_field():
    with pytest.raises(JobFileError, match=r"spec\.runPolicy\.schedulingPolicy\.gangScheduler"):
        job(runPolicy={"schedulingPolicy": {"gangScheduler": "Yunikorn", "queue": "q"}})


def test_no_gang_scheduler_takes_no_group_and_leaves_the_pods_as_built():
    the_job = job()
    pod = build_worker_pod(the_job, 0, default_image="x")
    assert NONE.resource is None and NONE.group(the_job, 0, 2, pod) is None and NONE.admitted({})
    assert "schedulerName" not in pod["spec"] and pod["metadata"]["annotations"] == {}
    assert not [key for key in pod["metadata"]["labels"] if "kueue" in key]


def test_kueue_takes_no_group_object_and_admits_by_gating_the_pods_themselves():
    the_job = job(runPolicy={"schedulingPolicy": {"queue": "research"}})
    assert KUEUE.resource is None and KUEUE.group(the_job, 0, 2, build_worker_pod(the_job, 0, default_image="x")) is None
    # Nothing for the operator to wait on: Kueue's scheduling gate holds the pods.
    assert KUEUE.admitted({})
    pod = build_worker_pod(the_job, 1, default_image="x", gang=2)
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "demo-gang-2"
    assert "schedulerName" not in pod["spec"]


def test_volcano_podgroup_has_the_gangs_size_as_min_member_its_requests_and_the_queue():
    resources = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    sidecar = {"spec": {"containers": [{"name": "log", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}
    the_job = job(workers={"replicas": 4, "minReplicas": 2, "resources": resources, "template": sidecar}, runPolicy=VOLCANO_POLICY)
    group = VOLCANO.group(the_job, 3, 3, build_worker_pod(the_job, 0, default_image="x", gang=3, replicas=3))
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "demo-gang-3" and group["metadata"]["namespace"] == "ml"
    assert group["metadata"]["labels"] == {"caramel.dev/job": "demo", "caramel.dev/gang": "3"}
    # A gang of 3 (running short of its 4) needs all 3: its world is fixed when it starts.
    # Volcano's enqueue weighs a queue's capability against minResources: the whole gang's, sidecar included.
    assert group["spec"] == {"minMember": 3, "queue": "training", "minResources": {"cpu": "1.05", "memory": "3221225472"}}
    assert "ownerReferences" not in group["metadata"]  # the handler adopts it (kopf.adopt)
    unasked = job(runPolicy=VOLCANO_POLICY)
    assert "minResources" not in VOLCANO.group(unasked, 0, 2, build_worker_pod(unasked, 0, default_image="x"))["spec"]
    assert VOLCANO.resource == PODGROUPS and str(PODGROUPS) == "podgroups.scheduling.volcano.sh/v1beta1"


def test_volcano_pods_name_their_podgroup_and_volcanos_scheduler():
    the_job = job(runPolicy=VOLCANO_POLICY, workers={"template": {"metadata": {"annotations": {"team": "vision"}}}})
    pod = build_worker_pod(the_job, 1, default_image="x", gang=3)
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"] == {"team": "vision", "scheduling.k8s.io/group-name": "demo-gang-3"}
    assert not [key for key in pod["metadata"]["labels"] if "kueue" in key]


@pytest.mark.parametrize(
    ("phase", "admitted"),
    [(None, False), ("Pending", False), ("Inqueue", True), ("Running", True), ("Unknown", False), ("Completed", False)],
)
def test_volcano_admits_a_gang_when_its_podgroup_is_inqueue_or_running(phase, admitted):
    the_job = job(runPolicy=VOLCANO_POLICY)
    group = VOLCANO.group(the_job, 0, 2, build_worker_pod(the_job, 0, default_image="x"))
    if phase is not None:
        group["status"] = {"phase": phase}
    assert VOLCANO.admitted(group) is admitted


def test_under_auto_volcano_places_the_gang_and_rstorm_may_still_be_asked_for():
    worker_pod = build_worker_pod(job(), 0, default_image="x")
    assert placed_by(job(runPolicy=VOLCANO_POLICY), worker_pod) == (PlacedBy.VOLCANO, "")
    assert placed_by(job(runPolicy=VOLCANO_POLICY, placement={"policy": "RStorm"}), worker_pod) == (PlacedBy.RSTORM, "")
    # Kueue's topology annotations do not take a Volcano gang from Volcano.
    tas = {"metadata": {"annotations": {"kueue.x-k8s.io/podset-preferred-topology": "cloud.example.com/rack"}}}
    assert placed_by(job(runPolicy=VOLCANO_POLICY, workers={"template": tas}), worker_pod) == (PlacedBy.VOLCANO, "")


def test_a_template_naming_another_scheduler_contradicts_volcano_naming_the_field():
    other = {"spec": {"schedulerName": "my-scheduler"}}
    [problem] = placement_problems(job(runPolicy=VOLCANO_POLICY, workers={"template": other}))
    assert problem.startswith("spec.workers.template.spec.schedulerName: my-scheduler contradicts")
    assert "gangScheduler Volcano" in problem
    assert placement_problems(job(runPolicy=VOLCANO_POLICY, workers={"template": {"spec": {"schedulerName": "volcano"}}})) == []
    assert placement_problems(job(workers={"template": other})) == []
