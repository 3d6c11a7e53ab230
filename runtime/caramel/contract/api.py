"""The CaramelJob API: the one definition used by `caramel run`, the operator and the CRD.

Every field carries a docstring; pydantic turns them into schema descriptions, so the
generated CRD shows them in `kubectl explain`. Field names are camelCase on the wire, as in
every Kubernetes API, and snake_case in Python.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "caramel.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND: Final = "CaramelJob"

# A DNS-1035 label, as Kubernetes requires of Service names; worker pods are named
# "<job>-worker-<index>", so the job name leaves room for that suffix within 63 characters.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_MAX_LENGTH = 52

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The kubelet refuses a relative working directory only when it starts the container ("Cwd must
# be an absolute path"), after the gang was created: every restart would fail the same way.
ABSOLUTE_PATH_PATTERN = r"^/"


def _image_pattern() -> str:
    """An image reference as container runtimes parse it (the grammar of the OCI distribution
    project's `reference` package): [domain[:port]/]path[:tag][@digest], path lower-case.
    A name outside it leaves a pod waiting forever with InvalidImageName."""
    component = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
    domain_component = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
    domain = rf"(?:{domain_component}(?:\.{domain_component})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
    tag = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
    digest = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
    return rf"^(?:{domain}/)?{component}(?:/{component})*(?::{tag})?(?:@{digest})?$"


IMAGE_PATTERN = _image_pattern()
IMAGE_MAX_LENGTH = 4096

# Kubernetes' resource quantity (what its own CRDs put on int-or-string quantities), without
# the sign: a negative request or limit is never meant.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# What each pattern means, for error messages in the user's terms rather than as a regex.
PATTERN_MEANINGS = {
    JOB_NAME_PATTERN: "lower-case letters, digits and '-', starting with a letter and not ending with '-'",
    ENV_NAME_PATTERN: "letters, digits and '_', not starting with a digit",
    IMAGE_PATTERN: "a container image reference such as caramel-runtime:0.1.0 or registry.example.com/team/train:2 "
    "(lower-case repository, no spaces)",
    QUANTITY_PATTERN: "a Kubernetes quantity such as 2, 500m or 4Gi",
    ABSOLUTE_PATH_PATTERN: "an absolute path, starting with /",
}

MiB = 1024 * 1024

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises, by which a job asks for GPUs."""
WHOLE_NUMBER_PATTERN = r"^[0-9]+$"
# A GPU count in CEL: a quantity is an integer or a string (x-kubernetes-int-or-string), written
# here as digits either way. Device plugins hand out whole devices: Kubernetes refuses a fraction.
_CEL_GPUS = f"string(self.limits['{GPU_RESOURCE}'])"
_CEL_HAS_GPUS = f"has(self.limits) && '{GPU_RESOURCE}' in self.limits"


class ApiModel(BaseModel):
    """Base of every API type: camelCase aliases, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


def _quantity(value: Any) -> int | str:
    # One check with one message: a union of int and patterned str would report a failure per
    # member, in pydantic's terms.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value):
        return value
    raise ValueError(f"must be {PATTERN_MEANINGS[QUANTITY_PATTERN]}, not negative")


# Longer than any quantity people write; bounded, so that the API server's cost estimate of a CEL
# rule reading one (the GPU count's) stays small.
QUANTITY_MAX_LENGTH = 64

# A Kubernetes resource quantity such as 2, "500m" or "4Gi".
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": QUANTITY_PATTERN, "maxLength": QUANTITY_MAX_LENGTH},
            ],
            "description": "A Kubernetes quantity, such as 2, 500m or 4Gi.",
        }
    ),
]


class Resources(ApiModel):
    """Compute resources of each worker container, as in a Kubernetes container spec. GPUs are
    asked for as NVIDIA's device plugin takes them: a whole number of nvidia.com/gpu in limits
    (and, if at all, the same number in requests)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!({_CEL_HAS_GPUS}) || {_CEL_GPUS}.matches('{WHOLE_NUMBER_PATTERN}')",
                    "message": f"limits.{GPU_RESOURCE} must be a whole number of GPUs, such as 1 or 8",
                },
                {
                    "rule": f"!has(self.requests) || !('{GPU_RESOURCE}' in self.requests) || "
                    f"({_CEL_HAS_GPUS} && string(self.requests['{GPU_RESOURCE}']) == {_CEL_GPUS})",
                    "message": f"requests.{GPU_RESOURCE} needs the same number in limits: Kubernetes takes GPUs as limits",
                },
            ]
        }
    )

    requests: dict[str, Quantity] = {}
    """Minimum resources the scheduler reserves for each worker, e.g. {cpu: 2, memory: 4Gi}."""

    limits: dict[str, Quantity] = {}
    """Maximum resources each worker may use, e.g. {memory: 8Gi, nvidia.com/gpu: 2}."""

    @model_validator(mode="after")
    def _whole_gpus_in_limits(self) -> Resources:
        limit, request = self.limits.get(GPU_RESOURCE), self.requests.get(GPU_RESOURCE)
        if limit is not None and not re.fullmatch(WHOLE_NUMBER_PATTERN, str(limit)):
            raise ValueError(f"limits.{GPU_RESOURCE} must be a whole number of GPUs, such as 1 or 8 (got {limit!r})")
        if request is not None and str(request) != str(limit):
            limited = f"is {limit!r}" if limit is not None else "is not set"
            raise ValueError(
                f"requests.{GPU_RESOURCE} is {request!r} but limits.{GPU_RESOURCE} {limited}: Kubernetes takes GPUs as "
                "limits, and requests, where given, must be the same number"
            )
        return self

    @property
    def gpus(self) -> int:
        """GPUs each worker asks for (limits nvidia.com/gpu); 0 where none."""
        return int(str(self.limits.get(GPU_RESOURCE, 0)))


class MemoryAllocator(StrEnum):
    """Where the training processes' memory comes from."""

    TCMALLOC = "tcmalloc"
    """tcmalloc, preloaded into every training process, serves TensorFlow's CPU kernels (oneDNN)
    as well: their buffers no longer sit in a pool of oneDNN's own, which grows with
    fragmentation and is never handed back. The image carries it; a `caramel run` machine
    without it (Debian and Ubuntu: libtcmalloc-minimal4) falls back to `tensorflow`, and the
    worker's log says so."""

    TENSORFLOW = "tensorflow"
    """The C library's malloc, with oneDNN's own buffer pool: what a training process gets
    unless something chooses otherwise."""


class Workers(ApiModel):
    """The gang of identical workers that train together."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # Guarded as Scheduling's rule is: the API server also checks it on the
                    # schema's default ({}), where neither field is set.
                    "rule": "!has(self.minReplicas) || !has(self.replicas) || self.minReplicas <= self.replicas",
                    "message": "minReplicas must not exceed replicas",
                    "fieldPath": ".minReplicas",
                },
                {
                    "rule": "!has(self.slotsPerWorker) || !has(self.resources) || "
                    f"!(has(self.resources.limits) && '{GPU_RESOURCE}' in self.resources.limits) || "
                    f"!string(self.resources.limits['{GPU_RESOURCE}']).matches('{WHOLE_NUMBER_PATTERN}') || "
                    f"int(string(self.resources.limits['{GPU_RESOURCE}'])) == 0 || "
                    f"self.slotsPerWorker <= int(string(self.resources.limits['{GPU_RESOURCE}']))",
                    "message": f"slotsPerWorker must not exceed the GPUs each worker asks for (resources.limits {GPU_RESOURCE}): "
                    "each rank trains on a GPU of its own",
                    "fieldPath": ".slotsPerWorker",
                },
            ]
        }
    )

    replicas: int = Field(2, ge=1, le=4096)
    """Number of workers (pods in a cluster, process groups under `caramel run`): the gang's size
    whenever they all fit."""

    min_replicas: int | None = Field(None, ge=1, le=4096)
    """Fewest workers the job may run with; unset, equal to replicas (the gang only ever runs
    whole). When the whole gang cannot be placed or scheduled within the operator's gang
    scheduling timeout, or a worker is lost with its node, the job restarts from its latest
    checkpoint with as many workers as fit, never fewer than this, and grows back towards
    replicas at a later restart or, once room appears, after its next checkpoint. The world size
    (HOROVOD_SIZE) and so the global batch change with it. `caramel run`: a worker the machine
    kills (SIGKILL, as the kernel's out-of-memory killer does) is lost."""

    resources: Resources = Resources()
    """Resources of each worker container."""

    slots_per_worker: int | None = Field(None, ge=1, le=64)
    """Training processes per worker (Horovod slots); the job runs replicas x slotsPerWorker ranks.
    Unset: one per GPU each worker asks for (resources.limits nvidia.com/gpu), else 1. Each rank of
    a GPU job trains on a GPU of its own, so it may not exceed that GPU count."""

    memory_allocator: MemoryAllocator = MemoryAllocator.TCMALLOC
    """The training processes' memory allocator. `tcmalloc` keeps the workers' peak RSS down at
    the same speed. Ignored when spec.env sets LD_PRELOAD."""

    template: dict[str, Any] = {}
    """Overrides merged into every worker pod: a Kubernetes PodTemplateSpec fragment with
    `metadata` (labels, annotations) and `spec` (nodeSelector, tolerations, volumes, ...).
    Ignored by `caramel run`."""

    @field_validator("min_replicas")
    @classmethod
    def _at_most_replicas(cls, value: int | None, info: ValidationInfo) -> int | None:
        replicas = info.data.get("replicas")  # absent when replicas itself was invalid
        if value is not None and replicas is not None and value > replicas:
            raise ValueError(f"must not exceed replicas ({replicas})")
        return value

    @field_validator("slots_per_worker")
    @classmethod
    def _a_gpu_per_rank(cls, value: int | None, info: ValidationInfo) -> int | None:
        resources = info.data.get("resources")  # absent when resources itself was invalid
        gpus = resources.gpus if resources is not None else 0
        if value is not None and gpus and value > gpus:
            raise ValueError(
                f"must not exceed the GPUs each worker asks for (resources.limits {GPU_RESOURCE}: {gpus}): "
                f"each of its {value} ranks trains on a GPU of its own"
            )
        return value

    @property
    def slots(self) -> int:
        """Training processes per worker: slotsPerWorker, or one per GPU where unset (else 1)."""
        if self.slots_per_worker is not None:
            return self.slots_per_worker
        return self.resources.gpus or 1

    @property
    def min_workers(self) -> int:
        """The fewest workers the gang may run with: minReplicas, or replicas where unset (the workers' CARAMEL_MIN_WORKERS)."""
        return self.replicas if self.min_replicas is None else self.min_replicas


class CleanPodPolicy(StrEnum):
    """Which worker pods are deleted when the job finishes."""

    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


class GangSchedulerName(StrEnum):
    """What admits a gang to the cluster as a whole (all its workers or none)."""

    KUEUE = "Kueue"
    VOLCANO = "Volcano"


class SchedulingPolicy(ApiModel):
    """How the gang is admitted to the cluster."""

    gang_scheduler: GangSchedulerName = GangSchedulerName.KUEUE
    """Kueue: the gang is submitted to Kueue as one plain pod group, which Kueue admits by quota
    and gates until then. Volcano: the operator creates a Volcano PodGroup (scheduling.volcano.sh)
    whose minMember is the gang's size, creates the pods once Volcano admits the group (its phase
    Inqueue or Running), and the pods are scheduled by Volcano (schedulerName volcano). Each needs
    its scheduler installed in the cluster."""

    queue: str = Field(min_length=1)
    """The queue the gang is submitted to: with Kueue a LocalQueue of the job's namespace, with
    Volcano a Queue (Volcano's own is named default)."""


class RunPolicy(ApiModel):
    """How the job as a whole is run, restarted and cleaned up (as in Kubeflow's runPolicy)."""

    backoff_limit: int = Field(3, ge=0, le=100)
    """Whole-gang restarts allowed after a worker fails before the job is marked Failed."""

    restart_on_script_error: bool = False
    """Whether a gang whose every failed worker's script raised an exception of its own (not a
    kill, not a lost worker, not a peer's connection error) before rank 0's first step restarts,
    as after other failures, up to backoffLimit. False (the default) fails the job at once, with
    reason ScriptError and the error in status.message: the same script would raise again."""

    active_deadline_seconds: int | None = Field(None, ge=1)
    """Seconds the job may run, counted from its start, before it is stopped and marked Failed."""

    ttl_seconds_after_finished: int | None = Field(None, ge=0)
    """Seconds after the job finishes (Succeeded or Failed) before it is deleted; unset keeps it."""

    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Pods deleted when the job finishes: None keeps all, Running deletes the pods still running
    (so failed pods and their logs survive), All deletes every pod."""

    suspend: bool = False
    """When true the job's pods are deleted and the job waits; setting it back to false resumes it."""

    scheduling_policy: SchedulingPolicy | None = None
    """Gang admission; unset creates the pods directly. Ignored by `caramel run`."""


class PlacementPolicy(StrEnum):
    """Who chooses the nodes of the gang's workers."""

    AUTO = "Auto"
    RSTORM = "RStorm"
    SCHEDULER = "Scheduler"


class PlacementSpec(ApiModel):
    """Where the gang's workers run, and so how far apart neighbouring ranks are. Ignored by
    `caramel run`."""

    policy: PlacementPolicy = PlacementPolicy.AUTO
    """RStorm: the operator places the gang with R-Storm (memory and GPUs hard constraints, CPU a soft
    one, workers kept close: same node, then same rack, then same zone), pins each worker to its node
    with a required node affinity, numbers the ranks along the topology and gives the workers the
    placed topology; a gang that does not fit is not created: the reason is in status.message and
    placement is tried again after the restart backoff. Scheduler: kube-scheduler places each
    pod; ranks in pod order, no topology. Auto: RStorm, except where a gang scheduler places the
    gang: Volcano (spec.runPolicy.schedulingPolicy.gangScheduler Volcano), or Kueue
    (spec.runPolicy.schedulingPolicy set for Kueue, or a kueue.x-k8s.io/podset-*-topology
    annotation in spec.workers.template.metadata), which is then told each pod's rank so that its
    topology-aware scheduling keeps neighbouring ranks close; and except where the workers ask for
    resources R-Storm does not weigh (extended resources other than nvidia.com/gpu, huge pages) or
    the operator may not read the cluster's nodes (namespaced RBAC), which the scheduler places."""


class Allreduce(StrEnum):
    """The algorithm that all-reduces the gradients."""

    AUTO = "auto"
    RING = "ring"
    MULTITREE = "multitree"


class Backend(StrEnum):
    """What moves the gradients between the ranks."""

    AUTO = "auto"
    TENSORFLOW = "tensorflow"
    HOROVOD = "horovod"


class Scheduling(ApiModel):
    """Caramel's communication scheduling: gradients are sent first where the next forward pass
    reads them first (TicTac), in buckets Caramel plans within the bounds below. The defaults
    choose everything automatically."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The API server also checks every rule on the schema's own default ({} here),
                    # before nested defaults apply: an unguarded rule rejects the whole CRD.
                    "rule": "!has(self.minBucketBytes) || !has(self.maxBucketBytes) || self.minBucketBytes <= self.maxBucketBytes",
                    "message": "minBucketBytes must not exceed maxBucketBytes",
                    "fieldPath": ".minBucketBytes",
                }
            ]
        }
    )

    min_bucket_bytes: int = Field(64 * 1024, ge=1)
    """Smallest bucket size the batching planner tries, in bytes. It is not a floor on every
    transfer: the planner may also send what is ready rather than wait for more, cut a bucket
    where its gradients are needed far apart in the next forward pass, and send what is left."""

    max_bucket_bytes: int = Field(64 * MiB, ge=1)
    """Largest transfer, in bytes: bigger buckets are not formed and bigger tensors are pipelined
    in chunks of at most this size."""

    replan_interval_steps: int = Field(20, ge=1)
    """Steps between re-plans from fresh latency and bandwidth observations (rank 0's fit is
    shared, so every rank follows the same plan). Caramel re-plans less often where a re-plan,
    as measured, would take more than 2% of the training time (steps of a few milliseconds)."""

    backend: Backend = Backend.AUTO
    """Collectives that move the gradients: tensorflow is TensorFlow's own collective ops over
    gRPC (nothing compiled); horovod is Horovod's over Gloo (built at set-up; the image has it);
    auto takes horovod wherever Horovod is installed, whatever API the script uses (its
    collectives cost less CPU per byte), and tensorflow where it is not. Either way Caramel
    schedules the transfers, and falls back to the backend's own way where that measured faster."""

    allreduce: Allreduce = Allreduce.AUTO
    """All-reduce algorithm: ring is Horovod's; multitree runs MULTITREE's trees over the job's
    topology (the placed nodes in a cluster, `caramel run --topology` locally), one tree per
    rank, so that fewer bytes cross slow uplinks; auto takes multitree only where it is
    predicted clearly faster on that topology, which a flat one never is. A gang that may run
    short (workers.minReplicas below replicas) takes the ring: its ranks re-form, which the
    trees cannot follow."""

    transport_port: int = Field(29500, ge=1024, le=65535)
    """TCP port of the multitree transport of each worker's first training process; processes
    that share a machine use the following ports."""

    @model_validator(mode="after")
    def _bucket_bounds_ordered(self) -> Scheduling:
        if self.min_bucket_bytes > self.max_bucket_bytes:
            raise ValueError(
                f"minBucketBytes ({self.min_bucket_bytes}) must not exceed "
                f"maxBucketBytes ({self.max_bucket_bytes})"
            )
        return self


class Rendezvous(ApiModel):
    """Where the workers meet: Caramel's rendezvous, served by worker 0, where Horovod's Gloo meets too."""

    port: int = Field(29400, ge=1024, le=65535)
    """TCP port of the rendezvous server on worker 0."""

    network_interface: str | None = None
    """Network interface Gloo binds to (HOROVOD_GLOO_IFACE); unset lets Gloo use the address the
    worker's hostname resolves to."""


class Metrics(ApiModel):
    """Prometheus metrics served by every training process."""

    enabled: bool = True
    """Serve per-iteration metrics over HTTP."""

    port: int = Field(9401, ge=1024, le=65535)
    """Port of rank 0's metrics endpoint; processes that share a host use the following ports."""


class Checkpoint(ApiModel):
    """Periodic checkpoints, written by rank 0 and restored on every start."""

    path: str = Field(min_length=1)
    """Directory of the checkpoints; it must survive restarts (a volume in a cluster)."""

    interval_steps: int = Field(100, ge=1)
    """Steps between checkpoints; the last step is always checkpointed."""


class EnvVar(ApiModel):
    """An environment variable for the training processes."""

    name: str = Field(pattern=ENV_NAME_PATTERN)
    """Variable name."""

    value: str = ""
    """Variable value."""


NEITHER_ENTRYPOINT = "neither script nor command is set: give one (script, a Python file every rank runs; or command, an argv list)"
BOTH_ENTRYPOINTS = "both script and command are set: give one of them"


class CaramelJobSpec(ApiModel):
    """What to train and how to run it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.script) || has(self.command)", "message": NEITHER_ENTRYPOINT},
                {"rule": "!(has(self.script) && has(self.command))", "message": BOTH_ENTRYPOINTS},
            ]
        }
    )

    image: str | None = Field(None, max_length=IMAGE_MAX_LENGTH, pattern=IMAGE_PATTERN)
    """Container image holding the Caramel runtime and the training code; defaults to the
    operator's runtime image. Ignored by `caramel run`."""

    script: str | None = None
    """Python training script run by every rank with the worker's Python interpreter. Give
    either script or command."""

    command: list[str] | None = Field(None, min_length=1)
    """Command run by every rank instead of a script, as an argv list."""

    args: list[str] = []
    """Arguments appended to the script or command."""

    working_dir: str | None = Field(None, pattern=ABSOLUTE_PATH_PATTERN)
    """Working directory of the training processes, an absolute path; defaults to the image's (in a
    cluster) or the current directory (under `caramel run`)."""

    env: list[EnvVar] = []
    """Extra environment variables for the training processes."""

    workers: Workers = Workers()
    """The worker gang."""

    run_policy: RunPolicy = RunPolicy()
    """Restarts, deadlines and clean-up."""

    placement: PlacementSpec = PlacementSpec()
    """Which nodes the workers run on. Ignored by `caramel run`."""

    caramel: Scheduling = Scheduling()
    """Communication scheduling settings."""

    rendezvous: Rendezvous = Rendezvous()
    """Where workers meet."""

    metrics: Metrics = Metrics()
    """Per-iteration Prometheus metrics."""

    checkpoint: Checkpoint | None = None
    """Periodic checkpoints; unset disables them."""

    @model_validator(mode="after")
    def _one_entrypoint(self) -> CaramelJobSpec:
        if self.script is None and self.command is None:
            raise ValueError(NEITHER_ENTRYPOINT)
        if self.script is not None and self.command is not None:
            raise ValueError(BOTH_ENTRYPOINTS)
        return self


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata Caramel reads; the rest is kept as it is."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    name: str = Field(min_length=1, max_length=JOB_NAME_MAX_LENGTH, pattern=JOB_NAME_PATTERN)
    """Job name: lower-case letters, digits and '-', starting with a letter, at most 52 characters."""

    namespace: str = "default"
    """Namespace of the job."""


def _api_version(value: Any) -> str:
    # Pydantic's Literal error names the expected value only; this one says what was wrong with it.
    if value != API_VERSION:
        raise ValueError(f"not a version of {KIND}; its versions are: {API_VERSION}")
    return API_VERSION


class CaramelJob(ApiModel):
    """A data-parallel TensorFlow training job run as a gang of Horovod workers."""

    api_version: Annotated[str, PlainValidator(_api_version)] = API_VERSION
    """API version: caramel.dev/v1alpha1."""

    kind: Literal["CaramelJob"] = KIND
    """Kind: CaramelJob."""

    metadata: ObjectMeta
    """Standard Kubernetes object metadata."""

    spec: CaramelJobSpec
    """The job's desired state."""

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def world_size(self) -> int:
        """Training processes (Horovod ranks) of the whole gang; a gang running with fewer workers
        (spec.workers.minReplicas) has fewer."""
        return self.spec.workers.replicas * self.spec.workers.slots


class Tuning(ApiModel):
    """What the runtime learnt of the network; a restarted gang plans its first steps from it."""

    bucket_bytes: int = Field(ge=1)
    """Largest gradient transfer in the plan in force, in bytes."""

    alpha_seconds: float | None = Field(None, ge=0)
    """Fitted fixed cost of one transfer, in seconds."""

    beta_seconds_per_byte: float | None = Field(None, gt=0)
    """Fitted inverse bandwidth, in seconds per byte."""


class Phase(StrEnum):
    """Where a job is in its life."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionType(StrEnum):
    """The conditions a job reports, as in Kubeflow's MPIJob."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    RESIZED = "Resized"


class Condition(ApiModel):
    """One observation of the job's state."""

    type: ConditionType
    """Which condition this is."""

    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""

    reason: str
    """A CamelCase word for why, such as WorkerFailed or Unschedulable."""

    message: str = ""
    """A sentence for people."""

    last_transition_time: str
    """When the condition last changed status (RFC 3339)."""


class WorkerCounts(ApiModel):
    """Worker pods of the current gang, by state."""

    total: int = 0
    """Workers the job asks for."""

    pending: int = 0
    """Workers not yet running: unscheduled, pulling their image or starting."""

    running: int = 0
    """Workers running."""

    succeeded: int = 0
    """Workers that finished successfully."""

    failed: int = 0
    """Workers that failed."""


class WorkerFailure(ApiModel):
    """The worker failure that caused the last restart or the job's failure."""

    worker: str
    """Name of the failed worker pod: the first to fail, where several did (its peers follow it
    with errors of their own, such as a connection reset)."""

    reason: str
    """Why it failed: the container's reason (Error, OOMKilled, ...), PodDeleted or NodeLost."""

    exit_code: int | None = None
    """Exit code of the worker's container, when it exited."""

    cause: str = ""
    """What says why the worker failed: the exception its rank ended on, else the first line of its
    output that reads as an error (an abort, a kill), which says why more often than its last
    lines do."""

    message: str = ""
    """The worker's termination message, whole: its summary of the failure (the failed rank, when it
    failed, the exception it ended on and its first error line, the last lines of output), or the
    end of its log where it wrote none."""


class TrainingProgress(ApiModel):
    """Rank 0's latest figures, scraped from its metrics endpoint."""

    step: int = 0
    """Training step reached."""

    step_seconds: float | None = None
    """Mean step time over the last scrape interval, in seconds."""

    bandwidth_bytes_per_second: float | None = None
    """Gradient bytes allreduced per second of communication."""

    loss: float | None = None
    """Loss of the latest step on rank 0."""

    checkpoint_step: int | None = None
    """Step of the latest checkpoint rank 0 wrote or restored (0 before any); a gang that found room
    to grow restarts after the next one."""

    elastic: bool = False
    """Whether the gang trains elastic: its script entered Horovod's `hvd.elastic.run` and
    spec.workers.minReplicas is below replicas. A lost worker but worker 0 is then created again
    while its peers go on, instead of a restart of the whole gang."""

    bandwidth: str = ""
    """The bandwidth for people, such as 1.2 GB/s."""

    update_time: str = ""
    """When these figures were scraped (RFC 3339)."""


class PlacedBy(StrEnum):
    """Who chose the nodes of a gang's workers."""

    RSTORM = "RStorm"
    SCHEDULER = "Scheduler"
    KUEUE = "Kueue"
    VOLCANO = "Volcano"


class WorkerNode(ApiModel):
    """Where R-Storm put one worker."""

    node: str
    """Name of the node."""

    rack: str
    """The node's rack, as zone/rack (zone/node:<name> for a node without the rack label)."""

    zone: str
    """The node's zone (label topology.kubernetes.io/zone); empty without it."""


class GangPlacement(ApiModel):
    """How the current gang's workers are placed."""

    gang: int
    """The gang generation this placement is for."""

    by: PlacedBy
    """RStorm: the operator chose every worker's node (a required node affinity per pod);
    Scheduler: kube-scheduler chooses; Kueue: Kueue and the scheduler choose, ranks given to Kueue;
    Volcano: Volcano's scheduler chooses."""

    workers: list[WorkerNode] = []
    """With RStorm: each worker's node, by worker index (rank order); empty while no placement fits."""

    cpu_short: list[str] = []
    """Nodes R-Storm gave more CPU than they have free (CPU is soft): their workers wait for CPU."""

    message: str = ""
    """Why the gang is placed this way, when it is not the policy's first choice."""

    attempts: int = 0
    """R-Storm placements of this gang that found no room."""

    retry_after: str | None = None
    """While no placement fits: when R-Storm tries again (RFC 3339)."""

    waiting_since: str | None = None
    """While no placement fits: when R-Storm first found no room for this gang (RFC 3339). Once the
    gang has waited the gang scheduling timeout, fewer workers may be placed
    (spec.workers.minReplicas)."""


class GangSize(ApiModel):
    """How many workers the gang runs with (spec.workers.minReplicas to replicas), and why."""

    gang: int
    """The gang generation whose size `workers` is; a newer gang is sized when it is created."""

    workers: int
    """Workers of the gang (its gang size): spec.workers.replicas, or fewer while they do not all fit."""

    next_min_workers: int
    """The fewest workers the next gang may start with before it has waited the gang scheduling
    timeout: spec.workers.replicas at first; after a failure, the size of the gang before where
    R-Storm places (it places more where they fit) and every worker where the scheduler does; the
    workers that survived a lost node; the workers scheduled when the rest waited out the
    timeout; spec.workers.minReplicas once it has."""

    reason: str = ""
    """Why the gang has fewer than spec.workers.replicas, such as "demo-worker-3 (NodeLost) was
    lost"; empty at full size."""

    next_look: str | None = None
    """While a gang placed by R-Storm runs short of spec.workers.replicas: when the operator next
    looks for room for more workers (RFC 3339)."""

    grow_to: int = 0
    """Room found for this many workers: the gang restarts with them after its next checkpoint."""

    grow_after_step: int = 0
    """The step of rank 0's latest checkpoint when the room was found: a later one ends the wait."""

    @model_validator(mode="before")
    @classmethod
    def _read_former_names(cls, value: Any) -> Any:
        # A job's status written by an operator from before the size's fields were renamed
        # (replicas -> workers, least -> nextMinWorkers): an upgraded operator takes it over.
        if isinstance(value, dict) and {"replicas", "least"} & value.keys():
            former = {"replicas": "workers", "least": "nextMinWorkers"}
            return {former.get(key, key): field for key, field in value.items()}
        return value


class CaramelJobStatus(ApiModel):
    """The observed state of a CaramelJob, written by the operator."""

    phase: Phase = Phase.PENDING
    """Pending, Running, Restarting, Succeeded, Failed or Suspended."""

    conditions: list[Condition] = []
    """Created, Running, Restarting, Succeeded, Failed and Suspended, each with a reason and message."""

    message: str = ""
    """What is happening now, for people: why the job is pending, or why it failed."""

    pending_reason: str = ""
    """While workers of the gang wait: the reason of the first one's wait (Unschedulable,
    ImagePullFailed, ...), or WaitingForAdmission while the gang's gang scheduler has yet to admit
    it. An Event (a Warning, but for WaitingForAdmission) is posted when it changes, not each time
    the detail does."""

    workers: WorkerCounts = WorkerCounts()
    """Worker pods of the current gang, by state."""

    ready_workers: str = ""
    """Running workers over requested workers, such as 3/4."""

    restarts: int = 0
    """Whole-gang restarts after failures so far, which spec.runPolicy.backoffLimit bounds (a gang
    restarted to change its size, spec.workers.minReplicas, is not counted)."""

    replaced_workers: int = 0
    """Workers of an elastic gang (progress.elastic) lost and created again while their peers went
    on. With the restarts they count against spec.runPolicy.backoffLimit."""

    replacing: list[str] = []
    """Workers of an elastic gang lost and not yet running again (each named in one
    WorkerReplaced Event)."""

    replaced_at: str | None = None
    """When the operator last decided to create lost workers of an elastic gang again (RFC 3339)."""

    backed_off_restarts: int = 0
    """Those of the restarts that waited a backoff: after a worker that failed of itself, not one
    lost with its pod or node, which restarts at once. Each doubles the next one's wait."""

    gang: int = 0
    """Generation of the current gang of pods: it grows by one at every restart."""

    restart_after: str | None = None
    """While Restarting: when the backoff ends and the new gang is created (RFC 3339)."""

    start_time: str | None = None
    """When the job started: the operator's first pass over it, or its resumption after a suspend
    (RFC 3339). spec.runPolicy.activeDeadlineSeconds counts from it."""

    completion_time: str | None = None
    """When the job finished (RFC 3339)."""

    last_failure: WorkerFailure | None = None
    """The worker failure behind the last restart or the failure of the job."""

    progress: TrainingProgress | None = None
    """Training figures from rank 0."""

    tuning: Tuning | None = None
    """Batching tuned by the runtime; a restarted gang starts from it."""

    placement: GangPlacement | None = None
    """How the current gang's workers are placed (spec.placement)."""

    size: GangSize | None = None
    """How many workers the gang runs with, and why fewer than spec.workers.replicas."""
