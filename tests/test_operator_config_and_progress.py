"""The operator's settings from its environment, and rank 0's progress read from real runtime metrics."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest

from caramel.metrics import PlanRecord, WorkerMetrics
from caramel.planner.timing import StepTimes, TransferTiming
from caramel.topology.labels import ClusterLinks
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
        ({"CARAMEL_OPERATOR_METRICS_PORT": "http"}, "CARAMEL_OPERATOR_METRICS_PORT: expected a whole number, got 'http'"),
        ({"CARAMEL_RESTART_BACKOFF_SECONDS": "-1"}, "CARAMEL_RESTART_BACKOFF_SECONDS: must be positive"),
        ({"CARAMEL_TOPOLOGY_RACK_LABEL": "my rack"}, "CARAMEL_TOPOLOGY_RACK_LABEL: expected a Kubernetes label key such as topology.caramel.dev/rack, got 'my rack'"),
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
