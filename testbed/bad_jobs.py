"""Invalid CaramelJobs, each with the field its refusal must name: written by hand, and fuzzed
from the CRD's own schema (one field of a valid job made wrong for its node's type or bounds)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

VALID_SPEC: dict[str, Any] = {
    "image": "caramel-runtime:0.1.0",
    "script": "examples/train_small.py",
    "args": ["--steps", "20"],
    "workingDir": "/app",
    "env": [{"name": "DATA", "value": "/data"}],
    "workers": {"replicas": 2, "slotsPerWorker": 1, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
    "runPolicy": {"backoffLimit": 3, "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60, "cleanPodPolicy": "Running", "suspend": False},
    "caramel": {"backend": "auto", "allreduce": "auto", "minBucketBytes": 65536, "maxBucketBytes": 67108864, "replanIntervalSteps": 20},
    "rendezvous": {"port": 29400},
    "metrics": {"enabled": True, "port": 9401},
    "checkpoint": {"path": "/ckpt", "intervalSteps": 10},
}


def valid_job(name: str = "bad-job") -> dict[str, Any]:
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name}, "spec": copy.deepcopy(VALID_SPEC)}


@dataclass(frozen=True)
class BadJob:
    title: str
    field: str
    """The field a refusal must name, as the user writes it."""
    manifest: dict[str, Any]
    fuzzed: bool = False


def _mutated(title: str, field: str, change: Callable[[dict[str, Any]], object]) -> BadJob:
    manifest = valid_job()
    change(manifest)
    return BadJob(title, field, manifest)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        *parents, last = _parts(path)
        node: Any = manifest
        for part in parents:
            node = node[part]
        node[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        *parents, last = _parts(path)
        node: Any = manifest
        for part in parents:
            node = node[part]
        del node[last]

    return change


def _gpus(kind: str, count: Any) -> Callable[[dict[str, Any]], None]:
    """Set the workers' nvidia.com/gpu in `kind` (requests or limits): a key with dots, which a path cannot name."""

    def change(manifest: dict[str, Any]) -> None:
        manifest["spec"]["workers"]["resources"][kind]["nvidia.com/gpu"] = count

    return change


def _parts(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in path.replace("[", ".[").split("."):
        parts.append(int(piece[1:-1]) if piece.startswith("[") else piece)
    return parts


HAND_WRITTEN: list[BadJob] = [
    _mutated("cpu that is not a quantity", "spec.workers.resources.requests.cpu", _set("spec.workers.resources.requests.cpu", "lots")),
    _mutated("negative memory limit", "spec.workers.resources.limits.memory", _set("spec.workers.resources.limits.memory", -1)),
    _mutated("negative memory as a string", "spec.workers.resources.limits.memory", _set("spec.workers.resources.limits.memory", "-2Gi")),
    _mutated("cpu as a YAML float", "spec.workers.resources.requests.cpu", _set("spec.workers.resources.requests.cpu", 0.5)),
    _mutated("empty image", "spec.image", _set("spec.image", "")),
    _mutated("image with a space", "spec.image", _set("spec.image", "caramel 0.1.0")),
    _mutated("upper-case image repository", "spec.image", _set("spec.image", "Team/Caramel:1")),
    _mutated("image with an empty tag", "spec.image", _set("spec.image", "caramel:")),
    _mutated("zero replicas", "spec.workers.replicas", _set("spec.workers.replicas", 0)),
    _mutated("too many replicas", "spec.workers.replicas", _set("spec.workers.replicas", 5000)),
    _mutated("replicas as words", "spec.workers.replicas", _set("spec.workers.replicas", "two")),
    _mutated("more minimum workers than workers", "spec.workers.minReplicas", _set("spec.workers.minReplicas", 3)),
    _mutated("zero minimum workers", "spec.workers.minReplicas", _set("spec.workers.minReplicas", 0)),
    _mutated("zero slots", "spec.workers.slotsPerWorker", _set("spec.workers.slotsPerWorker", 0)),
    _mutated("more slots than GPUs", "spec.workers.slotsPerWorker", lambda m: (_gpus("limits", 2)(m), _set("spec.workers.slotsPerWorker", 4)(m))),
    _mutated("half a GPU", "spec.workers.resources", _gpus("limits", "500m")),
    _mutated("GPUs requested, not limited", "spec.workers.resources", _gpus("requests", 1)),
    _mutated("misspelt workers field", "spec.workers.replica", _set("spec.workers.replica", 3)),
    _mutated("unknown spec field", "spec.gpus", _set("spec.gpus", 1)),
    _mutated("both script and command", "spec", _set("spec.command", ["python", "train.py"])),
    _mutated("neither script nor command", "spec", _drop("spec.script")),
    _mutated("empty command", "spec.command", lambda m: (m["spec"].pop("script"), m["spec"].update(command=[]))),
    _mutated("arguments not strings", "spec.args[1]", _set("spec.args", ["--steps", 20])),
    # The kubelet refused it only when starting the container, and the gang failed backoffLimit times.
    _mutated("relative working directory", "spec.workingDir", _set("spec.workingDir", "relative/dir")),
    _mutated("env name starting with a digit", "spec.env[0].name", _set("spec.env[0].name", "1DATA")),
    _mutated("env without a name", "spec.env[0].name", _drop("spec.env[0].name")),
    _mutated("negative backoff limit", "spec.runPolicy.backoffLimit", _set("spec.runPolicy.backoffLimit", -1)),
    _mutated("zero deadline", "spec.runPolicy.activeDeadlineSeconds", _set("spec.runPolicy.activeDeadlineSeconds", 0)),
    _mutated("negative TTL", "spec.runPolicy.ttlSecondsAfterFinished", _set("spec.runPolicy.ttlSecondsAfterFinished", -5)),
    _mutated("unknown clean-pod policy", "spec.runPolicy.cleanPodPolicy", _set("spec.runPolicy.cleanPodPolicy", "Failed")),
    _mutated("suspend as a word", "spec.runPolicy.suspend", _set("spec.runPolicy.suspend", "later")),
    _mutated("empty Kueue queue", "spec.runPolicy.schedulingPolicy.queue", _set("spec.runPolicy.schedulingPolicy", {"queue": ""})),
    _mutated("unknown placement policy", "spec.placement.policy", _set("spec.placement", {"policy": "Nearby"})),
    _mutated("unknown backend", "spec.caramel.backend", _set("spec.caramel.backend", "fastest")),
    _mutated("unknown all-reduce", "spec.caramel.allreduce", _set("spec.caramel.allreduce", "sometimes")),
    # The benchmarks' ablations are planning policies (caramel.planner.policy), not fields of a job.
    _mutated("a lab setting as a field", "spec.caramel.collective", _set("spec.caramel.collective", "split")),
    _mutated("smallest bucket above the largest", "spec.caramel", _set("spec.caramel.minBucketBytes", 2**30)),
    _mutated("zero re-plan interval", "spec.caramel.replanIntervalSteps", _set("spec.caramel.replanIntervalSteps", 0)),
    _mutated("privileged rendezvous port", "spec.rendezvous.port", _set("spec.rendezvous.port", 80)),
    _mutated("rendezvous port out of range", "spec.rendezvous.port", _set("spec.rendezvous.port", 70000)),
    _mutated("metrics switch as a number", "spec.metrics.enabled", _set("spec.metrics.enabled", 2)),
    _mutated("checkpoint without a path", "spec.checkpoint.path", _drop("spec.checkpoint.path")),
    _mutated("checkpoint interval zero", "spec.checkpoint.intervalSteps", _set("spec.checkpoint.intervalSteps", 0)),
    _mutated("job name with capitals", "metadata.name", _set("metadata.name", "Train_Small")),
    _mutated("job name too long", "metadata.name", _set("metadata.name", "a" * 53)),
    _mutated("another kind", "kind", _set("kind", "MPIJob")),
    _mutated("another API version", "apiVersion", _set("apiVersion", "caramel.dev/v1")),
    _mutated("no spec", "spec", _drop("spec")),
]


def fuzzed(schema: dict[str, Any], count: int, seed: int) -> Iterator[BadJob]:
    """`count` jobs, each a valid job with one field made invalid for its CRD schema node."""
    rng = random.Random(seed)
    leaves = list(_leaves(schema["properties"]["spec"], ["spec"]))
    for index in range(count):
        path, node = rng.choice(leaves)
        path, value, why = _invalid(path, node, rng)
        manifest = valid_job(f"fuzz-{index}")
        _place(manifest, path, value)
        field = _path_text(path)
        yield BadJob(f"{field} = {value!r} ({why})", field, manifest, fuzzed=True)


def _leaves(node: dict[str, Any], path: list[str | int]) -> Iterator[tuple[list[str | int], dict[str, Any]]]:
    """Fields a user sets, with their schema nodes; maps and lists reached through a sample entry."""
    if "properties" in node:
        yield path, node  # an object: an unknown field can be added to it
        for name, child in node["properties"].items():
            yield from _leaves(child, [*path, name])
    elif isinstance(node.get("additionalProperties"), dict):
        yield from _leaves(node["additionalProperties"], [*path, "cpu"])
    elif node.get("type") == "array" and "properties" in node.get("items", {}):
        yield from _leaves(node["items"], [*path, 0])
    elif not node.get("x-kubernetes-preserve-unknown-fields"):
        yield path, node


def _invalid(path: list[str | int], node: dict[str, Any], rng: random.Random) -> tuple[list[str | int], Any, str]:
    """A value that breaks the node's type or bounds, where to put it, and why it is wrong."""
    if "properties" in node:
        return [*path, "unknownField"], 1, "an unknown field"
    options: list[tuple[Any, str]] = []
    if node.get("x-kubernetes-int-or-string"):
        options += [("lots", "not a quantity"), (-rng.randint(1, 100), "negative"), ("-1Gi", "negative"), (1.5, "a float")]
    kind = node.get("type")
    if kind == "integer":
        options += [("many", "a word"), (2.5, "a fraction")]
        if "minimum" in node:
            options.append((node["minimum"] - rng.randint(1, 10), "below the minimum"))
        if "maximum" in node:
            options.append((node["maximum"] + rng.randint(1, 10), "above the maximum"))
    elif kind == "string":
        options.append((rng.randint(1, 9), "a number"))
        if "enum" in node:
            options.append(("Bogus", "not one of the choices"))
        if "pattern" in node:
            options.append(("Not Valid!", "does not match the pattern"))
        if node.get("minLength", 0) > 0:
            options.append(("", "empty"))
    elif kind == "boolean":
        options += [("maybe", "a word"), (7, "a number")]
    elif kind == "array":
        options += [("not-a-list", "a string"), ([{"nested": True}], "items of the wrong type")]
        if node.get("minItems", 0) > 0:
            options.append(([], "empty"))
    value, why = rng.choice(options)
    return path, value, why


def _place(manifest: dict[str, Any], path: list[str | int], value: Any) -> None:
    node: Any = manifest
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    node[path[-1]] = value
    if path == ["spec", "command"]:
        del node["script"]  # exactly one entrypoint, so that the command itself is what is wrong


def _path_text(path: list[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
