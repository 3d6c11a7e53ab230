"""The worker entrypoint's termination message: rank 0's last progress report when the worker
succeeds (the operator records the final step from it), a failure summary when a rank fails (its
first error line and last lines, and whether its script raised). Its wait for the rendezvous: as long as the contract says, and
cut short by SIGTERM. And the memory allocator it gives the training processes."""

from __future__ import annotations

import ctypes.util
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from caramel.contract.env import worker_command, worker_env
from caramel.contract.jobfile import parse_job
from caramel.contract.progress import parse_report
from caramel.contract.termination import TERMINATION_MESSAGE_BYTES, ScriptRaised, failure_cause, failure_time, script_raised
from conftest import REPO, free_port
from test_failure import NO_GPU_LOG
REPORT = "caramel-progress step=7 total=7 loss=0.5 step_seconds=0.01 examples_per_second=100 final=1"


def worker_of(tmp_path, training: str, index=0, message_path=None, workers=None, **env):
    """The argv and environment of worker `index` of a job of `training` (Python code); no
    process listens on its rendezvous port unless worker 0 runs."""
    replicas = max(index + 1, (workers or {}).get("replicas", 1))
    job = parse_job({"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "one"},
                     "spec": {"command": [sys.executable, "-c", training], "workers": {**(workers or {}), "replicas": replicas},
                              "rendezvous": {"port": free_port()}, "metrics": {"enabled": False}}})
    message = message_path or tmp_path / "termination-log"
    environ = {**os.environ, **worker_env(job, index, ["127.0.0.1"] * replicas), "CARAMEL_TERMINATION_MESSAGE_PATH": str(message), **env}
    return worker_command(job, python=sys.executable), environ, message


def run_worker(tmp_path, training: str, message_path=None, workers=None, **env) -> tuple[int, str | None, str]:
    argv, environ, message = worker_of(tmp_path, training, message_path=message_path, workers=workers, **env)
    result = subprocess.run(argv, env=environ, cwd=REPO, capture_output=True, text=True, timeout=120)
    return result.returncode, message.read_text() if message.exists() else None, result.stdout


def test_a_successful_worker_leaves_rank0s_last_report_as_its_termination_message(tmp_path):
    code, message, _ = run_worker(tmp_path, f"print('caramel-progress step=3 total=7 loss=1 step_seconds=0.01 examples_per_second=1 final=0'); print({REPORT!r})")
    assert code == 0
    assert parse_report(message).step == 7 and parse_report(message).final


def test_a_failed_worker_leaves_its_first_error_and_last_lines(tmp_path):
    """The kubelet's own fallback, the end of the log, lost the cause behind later lines (Gloo's
    "See exception message above")."""
    training = (
        f"print({REPORT!r}); print('loading shard 7'); print('ValueError: bad shard 7', flush=True)\n"
        "for i in range(300): print(f'follow-on noise {i} ' + 'x' * 40)\n"
        "raise SystemExit(3)"
    )
    code, message, _ = run_worker(tmp_path, training)
    assert code == 3
    lines = message.splitlines()
    assert lines[0] == "rank 0 exited with code 3" and lines[2:4] == ["rank 0 | ValueError: bad shard 7", "..."]
    assert abs((failure_time(message) - datetime.now(UTC)).total_seconds()) < 60, lines[1]
    assert lines[-1].startswith("rank 0 | follow-on noise 299 ")
    assert TERMINATION_MESSAGE_BYTES - 100 < len(message.encode()) <= TERMINATION_MESSAGE_BYTES


@pytest.mark.parametrize(
    ("training", "said"),
    [
        ("raise ValueError('learning_rate must be positive')", ScriptRaised(before_first_step=True)),
        (f"print({REPORT!r}, flush=True); raise ValueError('learning_rate must be positive')", ScriptRaised(before_first_step=False)),
        ("raise ConnectionResetError(104, 'Connection reset by peer')", None),  # a peer's failure, not the script's bug
        # TensorFlow's log in the GPU image on a machine without one: an error line first, which
        # neither ended the rank nor says why it ended.
        (f"print({NO_GPU_LOG!r}, flush=True); raise ConnectionResetError(104, 'Connection reset by peer')", None),
        ("import sys; print('ValueError: learning_rate must be positive'); sys.exit(1)", None),  # no exception: the script chose to exit
    ],
    ids=["before-the-first-step", "after-a-step", "a-peers-failure", "a-peers-failure-after-a-logged-error", "sys-exit"],
)
def test_a_failed_worker_says_whether_its_script_raised_and_whether_before_rank_0s_first_step(tmp_path, training, said):
    code, message, _ = run_worker(tmp_path, training)
    assert code == 1
    assert script_raised(message) == said, message
    assert "ValueError" not in training or failure_cause(message) == "rank 0 | ValueError: learning_rate must be positive"
    assert "ConnectionResetError" not in training or failure_cause(message) == "rank 0 | ConnectionResetError: [Errno 104] Connection reset by peer"


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


def test_sigterm_stops_a_worker_waiting_for_the_rendezvous(tmp_path):
    """The handler came only after the wait: as a pod's PID 1, which ignores a signal it has no
    handler for, a waiting worker held every deletion for the whole grace period. (Here it is
    no PID 1: without the handler SIGTERM would kill it, not let it exit 143 saying why.)"""
    argv, environ, message = worker_of(tmp_path, "print('never started')", index=1)
    process = subprocess.Popen(argv, env=environ, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if "waiting for the rendezvous" in line:
                break
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=5)[0]
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "worker 1 | stopped by SIGTERM while waiting for the rendezvous" in output


def test_the_rendezvous_wait_lasts_as_long_as_the_contract_says(tmp_path):
    """HOROVOD_GLOO_TIMEOUT_SECONDS, which worker 0's Gloo obeys, bounds the others' wait too."""
    argv, environ, message = worker_of(tmp_path, "print('never started')", index=1, HOROVOD_GLOO_TIMEOUT_SECONDS="1")
    result = subprocess.run(argv, env=environ, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout
    assert message.read_text().startswith("timed out after 1 s waiting for the rendezvous at 127.0.0.1:")


REPORT_DEVICES = "import os; print('devices', repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['HOROVOD_LOCAL_RANK'])"


def test_training_processes_see_their_workers_gpus_in_order_and_a_job_without_gpus_sees_none(tmp_path):
    """Each rank sees the worker's GPUs (of those the machine lists), so that Horovod's
    gpus[hvd.local_rank()] is its own; the runtime narrows TensorFlow to it at init."""
    gpus = {"slotsPerWorker": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}}
    code, _, output = run_worker(tmp_path, REPORT_DEVICES, workers=gpus, CUDA_VISIBLE_DEVICES="3,5,6")
    assert code == 0, output
    assert "GPUs of the training processes: 3,5 (2 per worker, spec.workers.resources.limits nvidia.com/gpu), one each" in output
    assert "rank 0 | devices '3,5' 0" in output and "rank 1 | devices '3,5' 1" in output
    code, _, output = run_worker(tmp_path, REPORT_DEVICES, CUDA_VISIBLE_DEVICES="0")
    assert code == 0, output
    assert "rank 0 | devices '' 0" in output and "GPUs of the training processes" not in output
