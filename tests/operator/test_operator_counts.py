"""The operator's own counters (caramel_operator_jobs_*_total) count each job once, against the
Kubernetes API emulator with the CaramelJob CRD in it."""

from __future__ import annotations

import re

from testbed.operator_harness import Emulator, Operator, eventually, terminated


def counter(operator: Operator, name: str) -> float:
    match = re.search(rf"^caramel_operator_jobs_{name}_total (\S+)$", operator.metrics(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_each_job_is_counted_once(tmp_path):
    emulator = Emulator(tmp_path)
    operator = Operator(emulator, tmp_path)
    try:
        api = emulator.api
        for name in ("one", "two"):
            api.create_job(name, {"script": "train.py", "workers": {"replicas": 2}})
        eventually(lambda: len(api.pods("one")) == len(api.pods("two")) == 2, what="both gangs")
        for pod in api.pods("one") + api.pods("two"):
            api.set_pod_status(pod["metadata"]["name"], terminated(0, reason="Completed"))
        eventually(lambda: counter(operator, "succeeded") == 2, what="two jobs succeeded")
        assert counter(operator, "created") == 2
    finally:
        operator.stop()
        emulator.stop()
