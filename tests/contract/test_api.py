"""The CaramelJob models and the job file reader: defaults, validation, errors that name fields."""

from __future__ import annotations

import pytest

from caramel.contract.api import Allreduce, Backend, CaramelJob, CleanPodPolicy
from caramel.contract.jobfile import JobFileError, load_job, parse_job
from conftest import REPO, runtime_metrics


def manifest(**spec):
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo"}, "spec": {"script": "train.py", **spec}}


def error_of(document) -> str:
    with pytest.raises(JobFileError) as caught:
        parse_job(document, source="job.yaml")
    return str(caught.value)


def test_minimal_job_gets_automatic_defaults():
    job = parse_job(manifest())
    assert job.spec.workers.replicas == 2
    assert job.spec.workers.slots_per_worker is None and job.spec.workers.slots == 1
    assert job.spec.caramel.backend is Backend.AUTO
    assert job.spec.caramel.allreduce is Allreduce.AUTO
    assert job.spec.run_policy.clean_pod_policy is CleanPodPolicy.RUNNING
    assert job.spec.run_policy.backoff_limit == 3
    assert job.spec.run_policy.restart_on_script_error is False
    assert job.spec.checkpoint is None
    assert job.world_size == 2


def test_full_job_reads_camel_case_fields():
    job = parse_job(
        manifest(
            args=["--steps", "5"],
            workers={"replicas": 4, "slotsPerWorker": 2, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 10, "cleanPodPolicy": "All", "suspend": True},
            caramel={"backend": "horovod", "allreduce": "ring", "minBucketBytes": 1, "maxBucketBytes": 2, "replanIntervalSteps": 5},
            metrics={"port": 9999},
            checkpoint={"path": "/ckpt", "intervalSteps": 7},
        )
    )
    assert job.world_size == 8
    assert job.spec.run_policy.active_deadline_seconds == 60
    assert job.spec.caramel.max_bucket_bytes == 2
    assert job.spec.checkpoint.interval_steps == 7
    assert job.spec.workers.resources.requests == {"cpu": "500m", "memory": "1Gi"}


def test_every_field_is_documented():
    def undocumented(model, path):
        for name, field in model.model_fields.items():
            if not field.description:
                yield f"{path}.{name}"
            annotation = field.annotation
            for candidate in getattr(annotation, "__args__", (annotation,)):
                if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                    yield from undocumented(candidate, f"{path}.{name}")

    assert list(undocumented(CaramelJob, "CaramelJob")) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"workers": {"replicas": 0}}, "spec.workers.replicas: Input should be greater than or equal to 1 (got 0)"),
        ({"workers": {"replicas": "many"}}, "spec.workers.replicas: Input should be a valid integer"),
        ({"workers": {"replica": 3}}, "spec.workers.replica: unknown field"),
        ({"caramel": {"allreduce": "sometimes"}}, "spec.caramel.allreduce: Input should be 'auto', 'ring' or 'multitree'"),
        ({"caramel": {"collective": "split"}}, "spec.caramel.collective: no longer a CaramelJob field (remove it: Caramel chooses;"),
        ({"caramel": {"minBucketBytes": 10, "maxBucketBytes": 5}}, "spec.caramel: minBucketBytes (10) must not exceed maxBucketBytes (5)"),
        ({"runPolicy": {"cleanPodPolicy": "Sometimes"}}, "spec.runPolicy.cleanPodPolicy"),
        ({"runPolicy": {"restartOnScriptError": "sometimes"}}, "spec.runPolicy.restartOnScriptError: Input should be a valid boolean"),
        ({"workers": {"resources": {"limits": {"memory": "lots"}}}}, "spec.workers.resources.limits.memory"),
        ({"command": ["python", "x.py"]}, "spec: both script and command are set: give one of them"),
        ({"checkpoint": {"intervalSteps": 5}}, "spec.checkpoint.path: Field required"),
        ({"env": [{"name": "1BAD", "value": "x"}]}, "spec.env[0].name: must be letters, digits and '_', not starting with a digit (got '1BAD')"),
        ({"workers": {"resources": {"requests": {"cpu": "lots"}}}}, "spec.workers.resources.requests.cpu: must be a Kubernetes quantity such as 2, 500m or 4Gi, not negative (got 'lots')"),
        ({"workers": {"resources": {"limits": {"memory": -1}}}}, "spec.workers.resources.limits.memory: must be a Kubernetes quantity"),
        ({"workers": {"resources": {"limits": {"memory": "-1Gi"}}}}, "spec.workers.resources.limits.memory: must be a Kubernetes quantity"),
        ({"workers": {"resources": {"requests": {"cpu": 0.5}}}}, "spec.workers.resources.requests.cpu: must be a Kubernetes quantity"),
        ({"image": ""}, "spec.image: must be a container image reference such as caramel-runtime:0.1.0"),
        ({"image": "my image:1"}, "spec.image: must be a container image reference"),
        ({"image": "Team/Train:1"}, "spec.image: must be a container image reference"),
        ({"image": "train:"}, "spec.image: must be a container image reference"),
        # The kubelet refused it only when starting each container: the gang failed backoffLimit times.
        ({"workingDir": "relative/dir"}, "spec.workingDir: must be an absolute path, starting with / (got 'relative/dir')"),
        ({"workers": {"replicas": 3, "minReplicas": 4}}, "spec.workers.minReplicas: must not exceed replicas (3) (got 4)"),
        # replicas' default (2) binds minReplicas too.
        ({"workers": {"minReplicas": 3}}, "spec.workers.minReplicas: must not exceed replicas (2) (got 3)"),
        ({"workers": {"replicas": 3, "minReplicas": 0}}, "spec.workers.minReplicas: Input should be greater than or equal to 1 (got 0)"),
    ],
)
def test_invalid_fields_are_named(spec, expected):
    assert expected in error_of(manifest(**spec))


def test_invalid_job_name_is_named():
    document = manifest()
    document["metadata"]["name"] = "Bad_Name"
    assert "metadata.name: must be lower-case letters, digits and '-', starting with a letter" in error_of(document)


def test_an_unknown_api_version_names_the_versions_there_are():
    document = manifest()
    document["apiVersion"] = "caramel.dev/v2"
    assert "apiVersion: not a version of CaramelJob; its versions are: caramel.dev/v1alpha1 (got 'caramel.dev/v2')" in error_of(document)


def test_wrong_kind_is_named():
    document = manifest()
    document["kind"] = "MPIJob"
    assert "kind: Input should be 'CaramelJob'" in error_of(document)


def test_all_problems_are_listed_at_once():
    message = error_of(manifest(workers={"replicas": 0}, metrics={"port": 1}))
    assert "spec.workers.replicas" in message and "spec.metrics.port" in message


def test_load_job_reports_yaml_syntax_with_position(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("spec:\n  workers: [unclosed\n")
    with pytest.raises(JobFileError, match=r"not valid YAML at line 3, column 1: expected ',' or ']'"):
        load_job(path)


def test_load_job_reports_missing_file(tmp_path):
    with pytest.raises(JobFileError, match="cannot read job file .*nope.yaml: No such file"):
        load_job(tmp_path / "nope.yaml")


def test_load_job_rejects_non_mapping_and_multiple_documents(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(JobFileError, match="expected a CaramelJob mapping, got list"):
        load_job(path)
    path.write_text("a: 1\n---\nb: 2\n")
    with pytest.raises(JobFileError, match="exactly one CaramelJob document, found 2"):
        load_job(path)


def test_quickstart_example_is_valid():
    job = load_job(REPO / "examples" / "quickstart.yaml")
    assert job.name == "quickstart"
    assert (REPO / job.spec.script).is_file()


def test_docs_document_every_runtime_metric():
    page = (REPO / "docs" / "metrics.md").read_text()
    undocumented = [name for name in runtime_metrics() if name not in page]
    assert undocumented == []


def test_messages_speak_of_fields_not_of_pydantic_internals():
    """One line per bad field, in the user's terms: no union member tags, no regular expressions."""
    message = error_of(manifest(workers={"resources": {"requests": {"cpu": "lots"}}}, env=[{"name": "1BAD"}]))
    assert message.count("\n") == 2, message
    for internal in ("int", "constrained-str", "function-plain", "pattern", "^"):
        assert f".{internal}" not in message and f"'{internal}" not in message, message


@pytest.mark.parametrize(
    "quantity", [0, 2, "2", "500m", "1.5", ".5", "4Gi", "128974848", "129e6", "129M", "123Mi", "1k", "1e3"]
)
def test_kubernetes_quantities_are_accepted(quantity):
    job = parse_job(manifest(workers={"resources": {"requests": {"cpu": quantity}}}))
    assert job.spec.workers.resources.requests["cpu"] == quantity


@pytest.mark.parametrize(
    "image",
    [
        "caramel:0.1.0",
        "caramel",
        "team/train:2",
        "registry.example.com:5000/team/caramel:0.1.0-rc1",
        "localhost/caramel",
        "ghcr.io/org/sub/image_name__x-y:v1.2_3",
        "[::1]:5000/caramel:dev",
        "caramel@sha256:" + "a" * 64,
        "caramel:0.1.0@sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_image_references_are_accepted(image):
    assert parse_job(manifest(image=image)).spec.image == image


@pytest.mark.parametrize(
    ("workers", "slots", "gpus"),
    [
        ({}, 1, 0),
        ({"resources": {"limits": {"nvidia.com/gpu": 4}}}, 4, 4),
        ({"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": 2}}}, 2, 2),
        ({"slotsPerWorker": 2, "resources": {"limits": {"nvidia.com/gpu": 4}}}, 2, 4),
        ({"slotsPerWorker": 3}, 3, 0),
        # No GPU asked for: slots stand as given.
        ({"slotsPerWorker": 3, "resources": {"limits": {"nvidia.com/gpu": 0}}}, 3, 0),
    ],
)
def test_slots_default_to_one_per_gpu(workers, slots, gpus):
    job = parse_job(manifest(workers=workers))
    assert (job.spec.workers.slots, job.spec.workers.resources.gpus) == (slots, gpus)
    assert job.world_size == 2 * slots


@pytest.mark.parametrize(
    ("resources", "slots", "named"),
    [
        ({"limits": {"nvidia.com/gpu": 2}}, 3, "spec.workers.slotsPerWorker: must not exceed the GPUs each worker asks for (resources.limits nvidia.com/gpu: 2)"),
        ({"limits": {"nvidia.com/gpu": "0.5"}}, None, "spec.workers.resources: limits.nvidia.com/gpu must be a whole number of GPUs"),
        ({"limits": {"nvidia.com/gpu": "1000m"}}, None, "spec.workers.resources: limits.nvidia.com/gpu must be a whole number of GPUs"),
        ({"requests": {"nvidia.com/gpu": 1}}, None, "spec.workers.resources: requests.nvidia.com/gpu is 1 but limits.nvidia.com/gpu is not set"),
        ({"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 1}}, None, "requests.nvidia.com/gpu is 2 but limits.nvidia.com/gpu is 1"),
    ],
)
def test_gpu_counts_that_kubernetes_or_a_rank_per_gpu_cannot_take_are_refused_by_name(resources, slots, named):
    workers = {"resources": resources, **({"slotsPerWorker": slots} if slots else {})}
    assert named in error_of(manifest(workers=workers))
