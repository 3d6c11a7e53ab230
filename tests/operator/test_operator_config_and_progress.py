"""The operator's settings from its environment, and rank 0's progress read from real runtime metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from caramel.contract.api import CaramelJob
from caramel.metrics import PlanRecord, WorkerMetrics
from caramel.network.labels import ClusterLinks
from caramel.planner.timing import StepTimes, TransferTiming
from caramel_operator.config import OperatorSettings, SettingsError
from caramel_operator.progress import human_bandwidth, read_progress

NOW = datetime(2026, 11, 21, tzinfo=UTC)


def metrics_text(steps):
    metrics = WorkerMetrics(rank=0)
    metrics.record_plan(PlanRecord(bucket_bytes=1 << 20, alpha_seconds=0.001, beta_seconds_per_byte=2e-9, plan_changes=1, planned=True))
    for step, seconds in steps:
        transfers = (TransferTiming(25_000_000, seconds / 4), TransferTiming(25_000_000, seconds / 4))
        metrics.record_step(step, seconds, 0.75, StepTimes(transfers, (), seconds / 2, 0.0, seconds / 4))
    return generate_latest(metrics.registry).decode()


def test_progress_from_rank0_metrics():
    first = read_progress(metrics_text([(1, 1.0), (2, 0.5)]), None, NOW)
    assert first.progress.step == 2 and first.progress.step_seconds == pytest.approx(0.75)
    assert first.progress.bandwidth == "200.0 MB/s" and first.progress.loss == 0.75
    assert first.tuning.bucket_bytes == 1 << 20
    assert (first.tuning.alpha_seconds, first.tuning.beta_seconds_per_byte) == (0.001, 2e-9)
    # The next scrape averages only the steps since the last one.
    later = read_progress(metrics_text([(1, 1.0), (2, 0.5), (3, 0.2), (4, 0.2)]), first.totals, NOW)
    assert later.progress.step_seconds == pytest.approx(0.2)


def test_progress_before_any_step():
    reading = read_progress(generate_latest(WorkerMetrics(rank=0).registry).decode(), None, NOW)
    assert reading.progress.step == 0 and reading.progress.step_seconds is None and reading.tuning is None


def test_human_bandwidth():
    assert [human_bandwidth(v) for v in (12, 1_500, 2.5e6, 1.25e9)] == ["12 B/s", "1.5 kB/s", "2.5 MB/s", "1.2 GB/s"]


def test_settings_from_env():
    settings = OperatorSettings.from_env({"CARAMEL_WATCH_NAMESPACES": "a, b", "CARAMEL_RECONCILE_INTERVAL_SECONDS": "0.5"})
    assert settings.watch_namespaces == ("a", "b") and settings.reconcile_interval_seconds == 0.5
    assert OperatorSettings.from_env({}).watch_namespaces == ()


def test_settings_defaults():
    settings = OperatorSettings.from_env({})
    assert (settings.runtime_image, settings.metrics_port, settings.health_port) == ("caramel-runtime:0.1.0", 8000, 8080)
    assert (settings.api_request_timeout_seconds, settings.api_connect_timeout_seconds, settings.watch_stall_seconds) == (10, 5, 60)
    assert (settings.reconcile_interval_seconds, settings.restart_backoff_seconds, settings.restart_backoff_max_seconds) == (2, 10, 300)
    assert settings.gang_scheduling_timeout_seconds == 300 and settings.network_policy is True
    assert (settings.monitoring_namespace, settings.operator_namespace) == ("monitoring", "")


def test_empty_settings_keep_their_defaults_but_an_empty_namespace_or_gpu_image_means_none():
    names = [field.validation_alias for field in OperatorSettings.model_fields.values()]
    settings = OperatorSettings.from_env({name: "" for name in names if name != "CARAMEL_NETWORK_POLICY"})
    assert settings.monitoring_namespace == "" and settings.operator_namespace == "" and settings.gpu_runtime_image == ""
    defaults = {"monitoring_namespace": "monitoring", "gpu_runtime_image": "caramel-runtime-gpu:0.1.0"}
    assert settings.model_copy(update=defaults) == OperatorSettings.from_env({})
    spaced = OperatorSettings.from_env({"CARAMEL_NETWORK_POLICY": " False ", "CARAMEL_MONITORING_NAMESPACE": " obs ", "CARAMEL_WATCH_NAMESPACES": " a,, b ,"})
    assert (spaced.network_policy, spaced.monitoring_namespace, spaced.watch_namespaces) == (False, "obs", ("a", "b"))


def test_settings_from_the_process_environment_and_only_from_a_given_one(monkeypatch):
    monkeypatch.setenv("CARAMEL_WATCH_NAMESPACES", "team-a,team-b")
    monkeypatch.setenv("CARAMEL_TOPOLOGY_LINKS", '{"zone": {"gbps": 10}}')
    monkeypatch.setenv("caramel_runtime_image", "not/read:lowercase")  # variables are read by their exact names
    settings = OperatorSettings.from_env()
    assert settings.watch_namespaces == ("team-a", "team-b") and settings.links.zone.gbps == 10
    assert settings.runtime_image == "caramel-runtime:0.1.0"
    assert OperatorSettings(network_policy=False).watch_namespaces == ("team-a", "team-b")
    assert OperatorSettings.from_env({}) == OperatorSettings.from_env({"CARAMEL_RUNTIME_IMAGE": ""}) != settings
    monkeypatch.setenv("CARAMEL_OPERATOR_METRICS_PORT", "0")
    with pytest.raises(SettingsError, match="CARAMEL_OPERATOR_METRICS_PORT: Input should be greater than 0"):
        OperatorSettings.from_env()


def test_the_settings_class_documents_every_variable_and_the_docs_list_them():
    readme = (Path(__file__).parents[2] / "docs" / "operator.md").read_text()
    for name, field in OperatorSettings.model_fields.items():
        assert field.validation_alias.startswith("CARAMEL_") and field.description, name
        assert f"`{field.validation_alias}`" in readme, field.validation_alias


def test_topology_settings_from_env():
    default = OperatorSettings.from_env({})
    assert default.rack_label == "topology.caramel.dev/rack" and default.links == ClusterLinks()
    settings = OperatorSettings.from_env(
        {"CARAMEL_TOPOLOGY_RACK_LABEL": "example.com/rack", "CARAMEL_TOPOLOGY_LINKS": '{"rack": {"gbps": 25, "latencyUs": 20}}'}
    )
    assert settings.rack_label == "example.com/rack"
    assert settings.links.rack.gbps == 25 and settings.links.rack.latency_us == 20
    assert settings.links.node == ClusterLinks().node  # levels left out keep their defaults


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CARAMEL_OPERATOR_METRICS_PORT": "http"}, r"CARAMEL_OPERATOR_METRICS_PORT: Input should be a valid integer, unable to parse string as an integer \(got 'http'\)"),
        ({"CARAMEL_WATCH_STALL_SECONDS": "1m"}, r"CARAMEL_WATCH_STALL_SECONDS: Input should be a valid number, unable to parse string as a number \(got '1m'\)"),
        ({"CARAMEL_RESTART_BACKOFF_SECONDS": "-1"}, r"CARAMEL_RESTART_BACKOFF_SECONDS: Input should be greater than 0 \(got '-1'\)"),
        ({"CARAMEL_NETWORK_POLICY": "yes"}, r"CARAMEL_NETWORK_POLICY: expected true or false \(got 'yes'\)"),
        ({"CARAMEL_TOPOLOGY_RACK_LABEL": "my rack"}, r"CARAMEL_TOPOLOGY_RACK_LABEL: expected a Kubernetes label key such as topology.caramel.dev/rack \(got 'my rack'\)"),
        ({"CARAMEL_TOPOLOGY_RACK_LABEL": "Example.com/rack"}, "CARAMEL_TOPOLOGY_RACK_LABEL: expected a Kubernetes label key"),
        ({"CARAMEL_TOPOLOGY_LINKS": "rack=25"}, "CARAMEL_TOPOLOGY_LINKS: expected JSON such as"),
        ({"CARAMEL_TOPOLOGY_LINKS": "[25]"}, "CARAMEL_TOPOLOGY_LINKS: expected a JSON object of levels"),
        ({"CARAMEL_TOPOLOGY_LINKS": '{"rack": {"gbps": 0}}'}, r"CARAMEL_TOPOLOGY_LINKS: rack.gbps: Input should be greater than 0 \(got 0\)"),
        ({"CARAMEL_TOPOLOGY_LINKS": '{"spine": {"gbps": 10}}'}, r"CARAMEL_TOPOLOGY_LINKS: spine: unknown field"),
    ],
)
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        OperatorSettings.from_env(env)


def test_every_bad_setting_is_named():
    with pytest.raises(SettingsError) as raised:
        OperatorSettings.from_env({"CARAMEL_OPERATOR_HEALTH_PORT": "x", "CARAMEL_NETWORK_POLICY": "on", "CARAMEL_TOPOLOGY_LINKS": "[]"})
    assert [problem.split(":")[0] for problem in str(raised.value).split("; ")] == [
        "CARAMEL_OPERATOR_HEALTH_PORT",
        "CARAMEL_NETWORK_POLICY",
        "CARAMEL_TOPOLOGY_LINKS",
    ]


def gpu_job(image=None):
    spec = {"script": "t.py", "workers": {"resources": {"limits": {"nvidia.com/gpu": 2}}}, **({"image": image} if image else {})}
    return CaramelJob.model_validate({"metadata": {"name": "gpu"}, "spec": spec})


def test_gpu_jobs_get_the_gpu_image_and_the_gpu_nodes_tolerations_and_no_image_is_refused_naming_the_field():
    settings = OperatorSettings.from_env({})
    cpu_job = CaramelJob.model_validate({"metadata": {"name": "cpu"}, "spec": {"script": "t.py"}})
    assert (settings.default_image(gpu_job()), settings.default_image(cpu_job)) == ("caramel-runtime-gpu:0.1.0", "caramel-runtime:0.1.0")
    assert settings.gpu_tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    none = OperatorSettings.from_env({"CARAMEL_GPU_RUNTIME_IMAGE": " ", "CARAMEL_GPU_TOLERATIONS": "[]"})
    assert none.gpu_tolerations == () and none.image_problems(gpu_job(image="team/train:2")) == none.image_problems(cpu_job) == []
    [problem] = none.image_problems(gpu_job())
    assert problem.startswith("spec.image: the job asks for GPUs (spec.workers.resources.limits nvidia.com/gpu) and the operator has no GPU image")
    own = OperatorSettings.from_env({"CARAMEL_GPU_TOLERATIONS": '[{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]'})
    assert own.gpu_tolerations == ({"key": "sku", "value": "gpu", "effect": "NoSchedule"},)
    with pytest.raises(SettingsError, match="CARAMEL_GPU_TOLERATIONS: expected a JSON list of tolerations"):
        OperatorSettings.from_env({"CARAMEL_GPU_TOLERATIONS": '{"key": "sku"}'})
