"""Gang schedulers: what admits a gang to the cluster as a whole, behind one interface.

The model is mpi-operator's PodGroupControl: a gang scheduler makes the gang's group object (or
none), decorates the gang's pods (labels, annotations, schedulerName) and says from the group
object whether the gang was admitted. The group object's I/O (create it owned by the job, read
it, delete it when its gang is gone) is the handlers'; everything here is pure.

- `NONE` (spec.runPolicy.schedulingPolicy unset): no gang scheduler. The operator places the gang
  itself (R-Storm) or leaves it to kube-scheduler, and releases a gang stuck half-scheduled
  (the gang scheduling timeout, lifecycle/restart.py).
- `KUEUE`: a Kueue plain pod group. Kueue makes its Workload from the pods' labels and gates the
  pods until it admits them, so there is no group object and the pods are created at once.
- `VOLCANO`: a Volcano PodGroup (scheduling.volcano.sh/v1beta1) whose minMember is the gang's
  size and whose minResources are its workers' CPU and memory (without them Volcano enqueues a
  group whatever its queue's capability); the pods name it and are scheduled by Volcano. They are created only once Volcano admits
  the group (phase Inqueue, "controllers can start to create pods", or Running), as Volcano's own
  Job controller does.

`gang_scheduler(job)` chooses one from spec.runPolicy.schedulingPolicy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from caramel.contract.api import CaramelJob, GangSchedulerName, PlacedBy
from caramel_operator.labels import GANG_LABEL, JOB_LABEL, WORKER_INDEX_LABEL
from caramel_operator.node_resources import pod_requests

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# Names the label holding each pod's index in its group: Kueue's topology-aware scheduling places
# the pods in that order (rank-based ordering), so neighbouring ranks land close.
KUEUE_POD_INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
# The pod set annotations that ask Kueue for topology-aware scheduling.
KUEUE_TOPOLOGY_ANNOTATIONS = (
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kueue.x-k8s.io/podset-unconstrained-topology",
    "kueue.x-k8s.io/podset-slice-required-topology",
)

VOLCANO_SCHEDULER_NAME = "volcano"
# The annotation by which Volcano's scheduler finds a pod's PodGroup (volcano.sh/apis' KubeGroupNameAnnotationKey).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# Volcano's PodGroup phases in which the gang is admitted: Inqueue (passed the enqueue action:
# "controllers can start to create pods") and Running (minMember pods run).
VOLCANO_ADMITTED_PHASES = frozenset({"Inqueue", "Running"})


@dataclass(frozen=True)
class GroupResource:
    """The API resource of a gang scheduler's group object."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}"


PODGROUPS = GroupResource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")


@dataclass(frozen=True)
class ObservedGroup:
    """A gang's group object as the API server has it (the handlers read it)."""

    gang: int
    """The gang generation whose group this is."""

    found: Mapping[str, Any] | None = None
    """The object as read; None where it does not exist (yet)."""

    served: bool = True
    """False where the API server does not serve the group's resource: the scheduler is not installed."""


class GangScheduler(Protocol):
    """What admits a gang as a whole (mpi-operator's PodGroupControl, without the I/O)."""

    name: str
    """For messages: as spec.runPolicy.schedulingPolicy.gangScheduler names it."""

    placed_by: PlacedBy | None
    """Who places the gang under spec.placement.policy Auto; None: the operator chooses (R-Storm, or
    kube-scheduler where R-Storm cannot)."""

    resource: GroupResource | None
    """The resource of the group object the operator creates for each gang; None: it creates none."""

    installed: str
    """What the cluster needs installed for this scheduler, for the message when it is missing."""

    def group(self, job: CaramelJob, gang: int, replicas: int, worker_pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The group object of gang generation `gang` of `replicas` workers like `worker_pod`, not
        yet owned by the job (the handler adopts it); None where the scheduler takes none."""

    def decorate(self, pod: dict[str, Any], job: CaramelJob, gang: int, replicas: int) -> None:
        """Label and annotate a worker pod of the gang and set its schedulerName, in place."""

    def admitted(self, group: Mapping[str, Any]) -> bool:
        """Whether the group object says its gang was admitted, so that its pods may be created."""

    def problems(self, job: CaramelJob) -> list[str]:
        """Settings of the job this scheduler cannot run with, each naming the field."""


def group_name(job: CaramelJob, gang: int) -> str:
    """The name of a gang generation's group: a Kueue pod group's, a Volcano PodGroup's."""
    return f"{job.name}-gang-{gang}"


class _NoGroupObject:
    """The part of the interface of the schedulers for which the operator creates no group object."""

    resource: GroupResource | None = None

    def group(self, job: CaramelJob, gang: int, replicas: int, worker_pod: Mapping[str, Any]) -> dict[str, Any] | None:
        return None

    def admitted(self, group: Mapping[str, Any]) -> bool:
        return True

    def problems(self, job: CaramelJob) -> list[str]:
        return []


class NoGangScheduler(_NoGroupObject):
    """No gang scheduler: the pods go to kube-scheduler as they are."""

    name = "none"
    placed_by: PlacedBy | None = None
    installed = "nothing"

    def decorate(self, pod: dict[str, Any], job: CaramelJob, gang: int, replicas: int) -> None:
        return None


class Kueue(_NoGroupObject):
    """A Kueue plain pod group: the pods' labels and annotations are the whole request, and Kueue
    gates the pods (a scheduling gate) until it admits the group."""

    name = GangSchedulerName.KUEUE.value
    placed_by: PlacedBy | None = PlacedBy.KUEUE
    installed = "Kueue, with plain pod integration"

    def decorate(self, pod: dict[str, Any], job: CaramelJob, gang: int, replicas: int) -> None:
        policy = job.spec.run_policy.scheduling_policy
        assert policy is not None  # chosen by gang_scheduler() for a job that has one
        metadata = pod["metadata"]
        metadata["labels"][KUEUE_QUEUE_LABEL] = policy.queue
        metadata["labels"][KUEUE_GROUP_LABEL] = group_name(job, gang)
        # A gang running short (spec.workers.minReplicas) is a smaller group: Kueue admits what exists.
        metadata["annotations"][KUEUE_GROUP_COUNT_ANNOTATION] = str(replicas)
        metadata["annotations"][KUEUE_POD_INDEX_LABEL_ANNOTATION] = WORKER_INDEX_LABEL


class Volcano:
    """A Volcano PodGroup per gang: minMember is the gang's size, since a gang's world is fixed when
    it starts and no worker trains until all have joined."""

    name = GangSchedulerName.VOLCANO.value
    placed_by: PlacedBy | None = PlacedBy.VOLCANO
    resource: GroupResource | None = PODGROUPS
    installed = f"Volcano, whose CRDs serve {PODGROUPS}"

    def group(self, job: CaramelJob, gang: int, replicas: int, worker_pod: Mapping[str, Any]) -> dict[str, Any] | None:
        policy = job.spec.run_policy.scheduling_policy
        assert policy is not None  # chosen by gang_scheduler() for a job that has one
        spec: dict[str, Any] = {"minMember": replicas, "queue": policy.queue}
        # What the pods request as the scheduler counts it (sidecars, init containers, overhead),
        # GPUs (nvidia.com/gpu) among them; other extended resources are not. None requested, none
        # given: Volcano reads an empty minResources as no minimum too.
        requests = {name: format((amount * replicas).normalize(), "f") for name, amount in pod_requests(worker_pod).items() if amount}
        if requests:
            spec["minResources"] = requests
        return {
            "apiVersion": PODGROUPS.api_version,
            "kind": PODGROUPS.kind,
            "metadata": {
                "name": group_name(job, gang),
                "namespace": job.metadata.namespace,
                "labels": {JOB_LABEL: job.name, GANG_LABEL: str(gang)},
            },
            "spec": spec,
        }

    def decorate(self, pod: dict[str, Any], job: CaramelJob, gang: int, replicas: int) -> None:
        pod["spec"]["schedulerName"] = VOLCANO_SCHEDULER_NAME
        pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] = group_name(job, gang)

    def admitted(self, group: Mapping[str, Any]) -> bool:
        return (group.get("status") or {}).get("phase") in VOLCANO_ADMITTED_PHASES

    def problems(self, job: CaramelJob) -> list[str]:
        named = (job.spec.workers.template.get("spec") or {}).get("schedulerName")
        if named and named != VOLCANO_SCHEDULER_NAME:
            return [
                f"spec.workers.template.spec.schedulerName: {named} contradicts spec.runPolicy.schedulingPolicy.gangScheduler "
                f"Volcano, whose gangs only Volcano's scheduler ({VOLCANO_SCHEDULER_NAME}) admits whole; remove it"
            ]
        return []


NONE: GangScheduler = NoGangScheduler()
KUEUE: GangScheduler = Kueue()
VOLCANO: GangScheduler = Volcano()
_BY_NAME = {GangSchedulerName.KUEUE: KUEUE, GangSchedulerName.VOLCANO: VOLCANO}


def gang_scheduler(job: CaramelJob) -> GangScheduler:
    """The job's gang scheduler: spec.runPolicy.schedulingPolicy.gangScheduler, none where the
    job has no scheduling policy."""
    policy = job.spec.run_policy.scheduling_policy
    return NONE if policy is None else _BY_NAME[policy.gang_scheduler]


def kueue_topology_annotations(job: CaramelJob) -> list[str]:
    """The Kueue topology-aware scheduling annotations in spec.workers.template.metadata."""
    annotations = (job.spec.workers.template.get("metadata") or {}).get("annotations") or {}
    return [name for name in KUEUE_TOPOLOGY_ANNOTATIONS if name in annotations]
