"""The operator's own settings, read once from its environment (CARAMEL_* variables) by
pydantic-settings. `OperatorSettings` is their reference: each field names its variable, and
its docstring says what it means and how it is written. A variable left unset, empty or blank
keeps the field's default, except CARAMEL_MONITORING_NAMESPACE and CARAMEL_OPERATOR_NAMESPACE,
where empty means none, and CARAMEL_NETWORK_POLICY, which must say true or false."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Annotated, Any

import pydantic
from pydantic import Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError, PydanticUseDefault
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from caramel.contract.api import GPU_RESOURCE, CaramelJob
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS
from caramel.network.labels import DEFAULT_RACK_LABEL, ClusterLinks

# A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of at most 63
# alphanumerics, '-', '_' and '.', alphanumeric at both ends.
LABEL_KEY_PATTERN = re.compile(
    r"^(?:(?=.{1,253}/)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"(?=.{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

Stripped = Annotated[str, StringConstraints(strip_whitespace=True)]

# The taint GPU node pools commonly carry (GKE puts it on them; EKS's and NVIDIA's GPU operator's
# guides ask for it), so that only pods that ask for GPUs land there.
GPU_NODE_TOLERATIONS: tuple[dict[str, Any], ...] = ({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)

# The variables `OperatorSettings.from_env` was given, while it reads them.
_ENVIRON: ContextVar[Mapping[str, str]] = ContextVar("caramel_operator_environ")


class SettingsError(ValueError):
    """Operator environment variables with bad values; the message names each and says what is wrong."""


class OperatorSettings(BaseSettings):
    """The operator's settings: `OperatorSettings.from_env()` reads them from the environment,
    as does `OperatorSettings()`, whose keyword arguments (fields' names) override it."""

    model_config = SettingsConfigDict(
        frozen=True,
        # Variables are read by their exact names only.
        case_sensitive=True,
        # Fields are set by their names in code and by their variables' names from the environment.
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    runtime_image: str = Field("caramel-runtime:0.1.0", validation_alias="CARAMEL_RUNTIME_IMAGE")
    """Image of jobs that name no spec.image."""

    gpu_runtime_image: Stripped = Field("caramel-runtime-gpu:0.1.0", validation_alias="CARAMEL_GPU_RUNTIME_IMAGE")
    """Image of jobs that ask for GPUs (spec.workers.resources.limits nvidia.com/gpu) and name no
    spec.image; empty for none, which refuses such jobs."""

    gpu_tolerations: Annotated[tuple[dict[str, Any], ...], NoDecode] = Field(GPU_NODE_TOLERATIONS, validation_alias="CARAMEL_GPU_TOLERATIONS")
    """Tolerations added to the workers of jobs that ask for GPUs, beside their template's: a JSON
    list such as `[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]` (the
    default: the taint GPU node pools commonly carry); `[]` for none."""

    watch_namespaces: Annotated[tuple[str, ...], NoDecode] = Field((), validation_alias="CARAMEL_WATCH_NAMESPACES")
    """Namespaces to watch, comma-separated (`team-a,team-b`); empty watches the whole cluster."""

    metrics_port: int = Field(8000, gt=0, validation_alias="CARAMEL_OPERATOR_METRICS_PORT")
    """Port of the operator's own /metrics, and of its readiness endpoint /readyz."""

    health_port: int = Field(8080, gt=0, validation_alias="CARAMEL_OPERATOR_HEALTH_PORT")
    """Port of the liveness endpoint /healthz."""

    api_request_timeout_seconds: float = Field(10.0, gt=0, validation_alias="CARAMEL_API_REQUEST_TIMEOUT_SECONDS")
    """Longest wait for the answer to one Kubernetes API request of the operator's, its own and
    kopf's; watches have their own, longer timeouts."""

    api_connect_timeout_seconds: float = Field(5.0, gt=0, validation_alias="CARAMEL_API_CONNECT_TIMEOUT_SECONDS")
    """Longest wait for a connection to the Kubernetes API server."""

    watch_stall_seconds: float = Field(60.0, gt=0, validation_alias="CARAMEL_WATCH_STALL_SECONDS")
    """How long a change to a CaramelJob may go undelivered by the operator's watch before its
    liveness probe fails and the kubelet restarts it."""

    reconcile_interval_seconds: float = Field(2.0, gt=0, validation_alias="CARAMEL_RECONCILE_INTERVAL_SECONDS")
    """Longest time between two reconciliations of a job: one also follows every change of its
    pods at once, and the end of a backoff."""

    restart_backoff_seconds: float = Field(10.0, gt=0, validation_alias="CARAMEL_RESTART_BACKOFF_SECONDS")
    """Wait before the first gang restart after a worker failed, doubled at each further one. A
    gang whose worker was lost (its pod deleted or evicted, its node gone) restarts at once."""

    restart_backoff_max_seconds: float = Field(300.0, gt=0, validation_alias="CARAMEL_RESTART_BACKOFF_MAX_SECONDS")
    """Longest wait before a gang restart."""

    gang_scheduling_timeout_seconds: float = Field(300.0, gt=0, validation_alias="CARAMEL_GANG_SCHEDULING_TIMEOUT_SECONDS")
    """How long part of a gang may hold its nodes while the rest is unschedulable before the whole
    gang is released and retried with backoff, or runs with the scheduled part where
    spec.workers.minReplicas allows it. Also how long a gang R-Storm cannot place whole waits
    before fewer workers are placed, and how often a gang running short looks for room to grow:
    one patience for room, whichever way it goes."""

    network_policy: bool = Field(True, validation_alias="CARAMEL_NETWORK_POLICY")
    """Give every job a NetworkPolicy that admits only its own pods, the operator and the
    monitoring namespace: `true` or `false` (any case)."""

    monitoring_namespace: Stripped = Field("monitoring", validation_alias="CARAMEL_MONITORING_NAMESPACE")
    """Namespace whose pods may scrape the workers' metrics; empty for none."""

    operator_namespace: Stripped = Field("", validation_alias="CARAMEL_OPERATOR_NAMESPACE")
    """The operator's own namespace, from the downward API; empty admits operator pods of any
    namespace to the workers' metrics."""

    rack_label: Stripped = Field(DEFAULT_RACK_LABEL, validation_alias="CARAMEL_TOPOLOGY_RACK_LABEL")
    """The node label that names a node's rack, for placement and the placed topology: a
    Kubernetes label key."""

    links: Annotated[ClusterLinks, NoDecode] = Field(default_factory=ClusterLinks, validation_alias="CARAMEL_TOPOLOGY_LINKS")
    """Speed of each level of the cluster's network, for the placed topology: JSON such as
    `{"rack": {"gbps": 25, "latencyUs": 10}}`; levels local, node, rack and zone, each left out
    keeps its default."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> OperatorSettings:
        """The settings in environ and nowhere else; SettingsError names every variable with a
        bad value."""
        given = _ENVIRON.set(environ)
        try:
            return cls()
        except pydantic.ValidationError as error:
            raise SettingsError("; ".join(_describe(problem) for problem in error.errors(include_url=False))) from None
        finally:
            _ENVIRON.reset(given)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the variables from_env was given, else os.environ; no .env
        file and no secrets directory."""
        environ = _ENVIRON.get(None)
        return init_settings, env_settings if environ is None else _Variables(settings_cls, environ)

    @field_validator(
        "runtime_image",
        "metrics_port",
        "health_port",
        "api_request_timeout_seconds",
        "api_connect_timeout_seconds",
        "watch_stall_seconds",
        "reconcile_interval_seconds",
        "restart_backoff_seconds",
        "restart_backoff_max_seconds",
        "gang_scheduling_timeout_seconds",
        "rack_label",
        mode="before",
    )
    @classmethod
    def _empty_keeps_the_default(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise PydanticUseDefault()
        return value

    @field_validator("watch_namespaces", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(namespace.strip() for namespace in value.split(",") if namespace.strip())
        return value

    @field_validator("network_policy", mode="before")
    @classmethod
    def _true_or_false(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            if word not in ("true", "false"):
                raise PydanticCustomError("true_or_false", "expected true or false")
            return word == "true"
        return value

    @field_validator("rack_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if not LABEL_KEY_PATTERN.match(value):
            raise PydanticCustomError("label_key", f"expected a Kubernetes label key such as {DEFAULT_RACK_LABEL}")
        return value

    @field_validator("gpu_tolerations", mode="before")
    @classmethod
    def _json_tolerations(cls, value: Any) -> Any:
        document = _parsed_json(value, "tolerations_json", "a JSON list of tolerations")
        if not isinstance(document, (list, tuple)) or not all(isinstance(toleration, dict) for toleration in document):
            raise PydanticCustomError("tolerations_list", 'expected a JSON list of tolerations such as [{"key": "nvidia.com/gpu", "operator": "Exists"}]')
        return tuple(document)

    def default_image(self, job: CaramelJob) -> str:
        """The image of `job`'s workers where it names none: the GPU image for a job that asks for
        GPUs (where there is none, `image_problems` refuses the job)."""
        return self.gpu_runtime_image if job.spec.workers.resources.gpus and self.gpu_runtime_image else self.runtime_image

    def image_problems(self, job: CaramelJob) -> list[str]:
        """Why the job's workers have no image, naming the field."""
        if job.spec.image or not job.spec.workers.resources.gpus or self.gpu_runtime_image:
            return []
        return [
            f"spec.image: the job asks for GPUs (spec.workers.resources.limits {GPU_RESOURCE}) and the operator has no GPU "
            "image (CARAMEL_GPU_RUNTIME_IMAGE, the chart's gpuRuntimeImage): name an image built with CUDA"
        ]

    @field_validator("links", mode="before")
    @classmethod
    def _json_levels(cls, value: Any) -> Any:
        document = _parsed_json(value, "links_json", 'JSON such as {"rack": {"gbps": 25}}')
        if isinstance(value, str) and not isinstance(document, dict):
            raise PydanticCustomError("links_object", "expected a JSON object of levels (local, node, rack, zone)")
        return document

    @property
    def rendezvous_timeout_seconds(self) -> float:
        """How long the workers of a gang wait for each other: at least as long as part of a gang
        may wait for the rest to be scheduled, or worker 0 gives up on a peer the operator still
        waits for, and the gang fails instead of being released."""
        return max(RENDEZVOUS_TIMEOUT_SECONDS, self.gang_scheduling_timeout_seconds)

    def restart_backoff(self, restarts_so_far: int) -> float:
        """Exponential backoff before restart number restarts_so_far + 1."""
        return min(self.restart_backoff_max_seconds, self.restart_backoff_seconds * 2**restarts_so_far)


class _Variables(EnvSettingsSource):
    """pydantic-settings' reading of environment variables, from a given mapping of them."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env_vars = dict(environ)  # read as os.environ is: case_sensitive, empty values kept


def _parsed_json(value: Any, error_type: str, expected: str) -> Any:
    """A variable's JSON value, parsed; a value given in code (not a string) as it is. A blank
    variable keeps the field's default."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        raise PydanticUseDefault()
    try:
        return json.loads(value)
    except ValueError as error:
        raise PydanticCustomError(error_type, f"expected {expected}: {error}") from None


def _describe(problem: Mapping[str, Any]) -> str:
    """One problem as `VARIABLE: what is wrong (got value)`, with the path inside a JSON value
    (`CARAMEL_TOPOLOGY_LINKS: rack.gbps: ...`)."""
    variable, *path = problem["loc"]
    inside = ".".join(str(part) for part in path)
    message = "unknown field (check its spelling)" if problem["type"] == "extra_forbidden" else problem["msg"]
    given = problem.get("input")
    shown = "" if problem["type"] == "extra_forbidden" or isinstance(given, dict) else f" (got {given!r})"
    return f"{variable}: {inside + ': ' if inside else ''}{message.removeprefix('Value error, ')}{shown}"
