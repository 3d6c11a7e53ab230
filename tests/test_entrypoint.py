"""The worker entrypoint's termination message: rank 0's last progress report when the worker
succeeds (the operator records the final step from it), nothing when it fails (the kubelet then
takes the end of the log, FallbackToLogsOnError). And the memory allocator it gives the
training processes."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest

from caramel.job.contract import worker_command, worker_env
from caramel.job.jobfile import parse_job
from caramel.job.progress import parse_report
from conftest import REPO, free_port

REPORT = "caramel-progress step=7 total=7 loss=0.5 step_seconds=0.01 examples_per_second=100 final=1"


def run_worker(tmp_path, training: str, message_path=None, workers=None) -> tuple[int, str | None, str]:
    job = parse_job({"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "one"},
                     "spec": {"command": [sys.executable, "-c", training], "workers": {"replicas": 1, **(workers or {})},
                              "rendezvous": {"port": free_port()}, "metrics": {"enabled": False}}})
    message = message_path or tmp_path / "termination-log"
    env = {**os.environ, **worker_env(job, 0, ["127.0.0.1"]), "CARAMEL_TERMINATION_MESSAGE_PATH": str(message)}
    result = subprocess.run(worker_command(job, python=sys.executable), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    return result.returncode, message.read_text() if message.exists() else None, result.stdout


def test_a_successful_worker_leaves_rank0s_last_report_as_its_termination_message(tmp_path):
    code, message, _ = run_worker(tmp_path, f"print('caramel-progress step=3 total=7 loss=1 step_seconds=0.01 examples_per_second=1 final=0'); print({REPORT!r})")
    assert code == 0
    assert parse_report(message).step == 7 and parse_report(message).final


def test_a_failed_worker_leaves_no_termination_message(tmp_path):
    code, message, _ = run_worker(tmp_path, f"print({REPORT!r}); raise SystemExit(3)")
    assert code == 3 and message is None


def test_a_worker_whose_termination_log_cannot_be_written_still_succeeds(tmp_path):
    """Outside Kubernetes (docker, say) no kubelet provides the file."""
    code, message, _ = run_worker(tmp_path, f"print({REPORT!r})", message_path=tmp_path / "missing" / "termination-log")
    assert code == 0 and message is None


# What a training process reports of its allocator: whether tcmalloc is mapped into it, and
# whether oneDNN is told to take its buffers from malloc.
REPORT_ALLOCATOR = (
    "import os; print('allocator', 'tcmalloc' in open('/proc/self/maps').read(), "
    "os.environ.get('TF_ONEDNN_USE_SYSTEM_ALLOCATOR'))"
)


@pytest.mark.skipif(
    not ctypes.util.find_library("tcmalloc_minimal"),
    reason="tcmalloc is not installed here (apt-get install libtcmalloc-minimal4; .ci/run installs it)",
)
def test_training_processes_run_on_tcmalloc_by_default(tmp_path):
    code, _, output = run_worker(tmp_path, REPORT_ALLOCATOR)
    assert code == 0, output
    assert "training processes: memory from tcmalloc" in output
    assert "rank 0 | allocator True 1" in output


def test_training_processes_keep_tensorflows_allocator_when_the_job_asks(tmp_path):
    code, _, output = run_worker(tmp_path, REPORT_ALLOCATOR, workers={"memoryAllocator": "tensorflow"})
    assert code == 0, output
    assert "rank 0 | allocator False None" in output
