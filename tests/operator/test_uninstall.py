"""The chart's pre-delete hook (`python -m caramel_operator.uninstall`) against a real HTTP API
(kmock's emulator): it deletes every CaramelJob and waits until they are gone, the operator
releasing its finalizer from each as it goes, or, where no operator runs, the hook itself once its
patience is out. Without it `helm uninstall --wait` with crds.keep=false left the CRD Terminating
(issue 50); the cluster suite uninstalls the chart with a job left, on a real cluster."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from caramel_operator.cluster import Cluster
from caramel_operator.handlers import FINALIZER
from caramel_operator.uninstall import delete_jobs
from conftest import REPO
from testbed.operator_harness import JOBS, Operator, eventually

SPEC = {"script": "examples/train_small.py", "args": ["--steps", "10"], "workers": {"replicas": 2}}


def test_the_hook_deletes_every_job_and_waits_while_the_operator_releases_them(emulator, tmp_path):
    api = emulator.api
    operator = Operator(emulator, tmp_path)
    try:
        for name in ("first", "second"):
            api.running_job(name, SPEC)
        eventually(lambda: all(FINALIZER in (api.job(name)["metadata"].get("finalizers") or []) for name in ("first", "second")), what="kopf's finalizers")
        hook = subprocess.run(
            [sys.executable, "-m", "caramel_operator.uninstall"], cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "KUBECONFIG": str(emulator.kubeconfig), "CARAMEL_WATCH_NAMESPACES": ""},
        )  # fmt: skip
    finally:
        operator.stop()
    assert hook.returncode == 0, hook.stderr
    assert "caramel-uninstall: deleting 2 CaramelJob(s): default/first, default/second" in hook.stderr
    assert "every CaramelJob is gone" in hook.stderr and "removing" not in hook.stderr  # the operator released them
    assert api.items(JOBS) == []


def test_where_no_operator_releases_them_the_hook_removes_the_finalizer_itself(emulator, monkeypatch):
    api = emulator.api
    api.create_job("orphan", SPEC)
    api.patch(f"{JOBS}/orphan", {"metadata": {"finalizers": [FINALIZER, "other.example/keep"]}})
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(emulator.kubeconfig))
    said: list[str] = []

    async def uninstall() -> bool:
        cluster = Cluster(connect_timeout_seconds=5, request_timeout_seconds=10)
        # Another finalizer is not the operator's to remove: it is let go of as soon as the hook is done.
        done = asyncio.create_task(delete_jobs(cluster, (), said.append, patience_seconds=1, wait_seconds=6))
        await asyncio.sleep(3)
        api.patch(f"{JOBS}/orphan", {"metadata": {"finalizers": []}})
        return await done

    assert asyncio.run(uninstall())
    assert said[0] == "deleting 1 CaramelJob(s): default/orphan"
    assert f"removing {FINALIZER} from default/orphan" in said[1]
    assert said[-1].startswith("every CaramelJob is gone")
    assert api.items(JOBS) == []


def test_the_hook_with_no_job_says_so(emulator, monkeypatch):
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(emulator.kubeconfig))
    said: list[str] = []
    cluster = Cluster(connect_timeout_seconds=5, request_timeout_seconds=10)
    assert asyncio.run(delete_jobs(cluster, (), said.append))
    assert said == ["no CaramelJobs to delete"]
