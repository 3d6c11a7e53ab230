"""A worker asked to stop mid-training (SIGTERM to its entrypoint, as the kubelet sends a pod's
PID 1 when the pod is deleted, the gang restarts or the job is suspended) exits within 2 s and
writes nothing after (caramel.tensorflow.stopping): on Caramel's own loop, on a script written for
Horovod's API, and with a step that does not end.

On v1.36 the training process ignored SIGTERM (TensorFlow's coordination service, which the
tensorflow backend starts, takes it for itself) until the entrypoint's SIGKILL 10 s later: every
restart, deletion and suspend cost 11.5 s, and the old gang trained on, a checkpoint at step
1,100 written after a pod deleted at step 708.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from caramel.collectives.backend import horovod_installed
from caramel.contract.env import worker_command, worker_env
from caramel.contract.jobfile import parse_job
from conftest import REPO, SMALL_EXAMPLE, free_port_block

pytestmark = pytest.mark.e2e

STOP_SECONDS = 2.0
CHECKPOINT_INTERVAL = 5
PROGRESS = re.compile(r"caramel-progress step=(\d+)")


class Workers:
    """A job's workers started as pods start them: each its entrypoint, in its own process group,
    with the env contract of its index; their output collected line by line."""

    def __init__(self, spec: dict, cwd: Path = REPO) -> None:
        job = parse_job({"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "stop"},
                         "spec": {"workers": {"replicas": 2}, "rendezvous": {"port": free_port_block(3)}, "metrics": {"enabled": False}, **spec}})
        self.lines: list[str] = []
        self.processes = []
        for index in range(2):
            env = {**os.environ, **worker_env(job, index, ["127.0.0.1"] * 2)}
            process = subprocess.Popen(worker_command(job, python=sys.executable), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
            threading.Thread(target=self._read, args=(process,), daemon=True).start()
            self.processes.append(process)

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, found, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not found():
            assert all(p.poll() is None for p in self.processes), f"a worker exited:\n{self.output}"
            assert time.monotonic() < deadline, f"timed out:\n{self.output}"
            time.sleep(0.05)

    def step(self) -> int:
        return max((int(step) for step in PROGRESS.findall(self.output)), default=0)

    def stop(self, indices) -> list[float]:
        """SIGTERM the workers' entrypoints; the seconds each took to exit."""
        asked = time.monotonic()
        for index in indices:
            os.kill(self.processes[index].pid, signal.SIGTERM)
        took: dict[int, float] = {}
        while len(took) < len(indices):
            assert time.monotonic() < asked + 60, f"the workers did not exit:\n{self.output}"
            for index in indices:
                if index not in took and self.processes[index].poll() is not None:
                    took[index] = time.monotonic() - asked
            time.sleep(0.01)
        return [took[index] for index in indices]

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # the training processes die with their worker
            process.wait()


def latest_checkpoint_step(directory: Path) -> int:
    state = directory / "checkpoint"
    found = re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"', state.read_text(), re.MULTILINE) if state.exists() else None
    return int(found[1]) if found else 0


TRAINING_RUN = [str(SMALL_EXAMPLE), "--steps", "1000000", "--batch-size", "32", "--hidden", "64"]
# A checkpoint at the end of every epoch: Keras resumes at epoch boundaries only.
KERAS_FIT = [str(REPO / "examples" / "train_keras.py"), "--epochs", "1000000", "--steps-per-epoch", str(CHECKPOINT_INTERVAL), "--hidden", "64"]
LOOPS = [
    pytest.param(TRAINING_RUN, "tensorflow", id="TrainingRun-tensorflow"),
    pytest.param(TRAINING_RUN, "horovod", id="TrainingRun-horovod",
                 marks=pytest.mark.skipif(not horovod_installed(), reason="Horovod is not installed")),
    pytest.param(KERAS_FIT, "tensorflow", id="keras-fit-tensorflow"),
]


@pytest.mark.parametrize(("training", "backend"), LOOPS)
def test_a_gang_stopped_mid_training_exits_within_2_s_and_writes_no_checkpoint_after(tmp_path, training, backend):
    """Caramel's own loops, on either backend. The horovod backend stopped at once before, as
    nothing took SIGTERM there."""
    checkpoints = tmp_path / "checkpoints"
    workers = Workers({"script": training[0], "args": training[1:], "caramel": {"backend": backend},
                       "checkpoint": {"path": str(checkpoints), "intervalSteps": CHECKPOINT_INTERVAL}})
    try:
        workers.wait_for(lambda: workers.step() >= 100 and latest_checkpoint_step(checkpoints) > 0)
        at_stop = latest_checkpoint_step(checkpoints)
        took = workers.stop([0, 1])  # the whole gang, as a restart or a suspend deletes it
        print(f"\n{Path(training[0]).name} on the {backend} backend: the workers exited {', '.join(f'{seconds:.2f} s' for seconds in took)} after SIGTERM")
        assert max(took) < STOP_SECONDS, workers.output
        assert [p.returncode for p in workers.processes] == [128 + signal.SIGTERM] * 2
        # A checkpoint under way may have been written whole; none after it.
        assert latest_checkpoint_step(checkpoints) <= at_stop + CHECKPOINT_INTERVAL, workers.output
        assert workers.output.count("caramel: stopped by SIGTERM") == 2, workers.output
    finally:
        workers.kill()


def test_a_script_written_for_horovods_api_stops_within_2_s_without_writing(tmp_path):
    """Its loop is its own: it is stopped between two of its TensorFlow calls, and its own writes
    (Horovod's example saves a checkpoint at the end) and exit handlers do not run. On the
    tensorflow backend, whose coordination service took SIGTERM for itself."""
    script = REPO / "examples" / "horovod" / "mnist.py"
    workers = Workers({"script": str(script), "args": ["--steps", "1000000"], "caramel": {"backend": "tensorflow"}}, cwd=tmp_path)
    try:
        workers.wait_for(lambda: "Step #" in workers.output)
        took = workers.stop([1])
        print(f"\nthe worker exited {took[0]:.2f} s after SIGTERM")
        assert took[0] < STOP_SECONDS, workers.output
        assert "rank 1 | caramel: stopped by SIGTERM" in workers.output
        assert list(tmp_path.iterdir()) == [], "nothing written"
    finally:
        workers.kill()


STUCK = """
import os, time
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
if hvd.rank() == 1:
    time.sleep(600)  # never comes to the collective
print("rank 0 waits in a collective", flush=True)
hvd.allreduce(tf.ones([4]))
"""


def test_a_rank_stuck_in_a_step_is_stopped_within_2_s_all_the_same(tmp_path):
    """Python runs a signal handler only once TensorFlow returns: a rank waiting in a collective
    for a peer that does not come would hold the stop up for as long."""
    workers = Workers({"command": [sys.executable, "-c", STUCK], "caramel": {"backend": "tensorflow"}})
    try:
        workers.wait_for(lambda: "rank 0 waits in a collective" in workers.output)
        time.sleep(1)  # into the collective
        took = workers.stop([0])
        print(f"\nthe worker exited {took[0]:.2f} s after SIGTERM")
        assert took[0] < STOP_SECONDS, workers.output
        assert "the step under way did not end within 1 s" in workers.output
    finally:
        workers.kill()
