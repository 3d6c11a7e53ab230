"""`caramel run` with spec.workers.minReplicas: which gang follows which failure, with real worker
processes (the entrypoint, its rendezvous) running a scripted stand-in for training, so that no
TensorFlow is needed. tests/launch/test_local_run.py resumes a real training run at a smaller size."""

from __future__ import annotations

import re
import sys

from conftest import job_manifest, run_caramel, write_manifest

# Every training process says which world it is in. Gang after gang, it plays the first scripted
# failure no gang played yet: the process of that rank marks it played and fails so (SIGKILL, as
# the kernel's out-of-memory killer does, or exit 3, a crash); the others wait to be stopped. With
# no failure left, every process ends well.
SCRIPTED = """
import os, signal, sys, time
from pathlib import Path
marks, failures = Path(sys.argv[1]), sys.argv[2:]
rank = int(os.environ["HOROVOD_RANK"])
print(f"world {os.environ['HOROVOD_SIZE']} of {os.environ['CARAMEL_FULL_SIZE']}", flush=True)
pending = [(number, failure) for number, failure in enumerate(failures) if not (marks / f"played-{number}").exists()]
time.sleep(1)  # every process has read the marks before one is made
if not pending:
    sys.exit(0)
number, failure = pending[0]
how, who = failure.split(":")
if rank != int(who):
    time.sleep(120)
(marks / f"played-{number}").touch()
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
"""


def scripted_run(tmp_path, workers, *failures):
    manifest = job_manifest(
        script=None,
        command=[sys.executable, "-c", SCRIPTED, str(tmp_path)],
        args=list(failures),
        workers=workers,
        runPolicy={"backoffLimit": len(failures)},
    )
    return run_caramel("run", str(write_manifest(tmp_path, manifest)), timeout=120)


def worlds(output: str) -> list[str]:
    return sorted({line.split("| ")[-1] for line in output.splitlines() if "| world " in line})


def test_a_worker_the_machine_kills_is_left_out_of_the_next_gang(tmp_path):
    result = scripted_run(tmp_path, {"replicas": 3, "minReplicas": 2}, "kill:2")
    assert result.returncode == 0, result.stderr
    assert "= 3 rank(s), down to 2 worker(s) as workers are lost (spec.workers.minReplicas)" in result.stderr
    assert (
        "worker 2 exited with code 137; restarting the whole gang (1 of 1, spec.runPolicy.backoffLimit) in 1 s with 2 of 3 "
        "workers: worker 2 was lost (killed by SIGKILL, as the kernel does when the machine runs out of memory; "
        "spec.workers.minReplicas 2)"
    ) in result.stderr
    assert worlds(result.stderr) == ["world 2 of 3", "world 3 of 3"]
    assert "after 1 whole-gang restart(s), with 2 of 3 workers" in result.stderr


def test_a_crash_asks_for_the_whole_gang_again_and_min_replicas_is_the_floor(tmp_path):
    """As in a cluster: a lost worker shrinks the gang, a later restart grows it back, and a gang
    at minReplicas loses a worker without shrinking further."""
    result = scripted_run(tmp_path, {"replicas": 3, "minReplicas": 2}, "kill:2", "crash:1", "kill:1", "kill:1")
    assert result.returncode == 0, result.stderr
    sizing = re.findall(r"restarting the whole gang \(\d of 4, spec.runPolicy.backoffLimit\) in \d+ s(.*?)\. Its last lines", result.stderr)
    lost = "was lost (killed by SIGKILL, as the kernel does when the machine runs out of memory; spec.workers.minReplicas 2)"
    assert sizing == [f" with 2 of 3 workers: worker 2 {lost}", " with all 3 workers again", f" with 2 of 3 workers: worker 1 {lost}", ""]
    assert "after 4 whole-gang restart(s), with 2 of 3 workers" in result.stderr


def test_without_min_replicas_a_killed_worker_restarts_the_whole_gang(tmp_path):
    result = scripted_run(tmp_path, {"replicas": 2}, "kill:1")
    assert result.returncode == 0, result.stderr
    assert "in 1 s. Its last lines" in result.stderr and "workers:" not in result.stderr
    assert worlds(result.stderr) == ["world 2 of 2"]
    assert "Succeeded test-job" in result.stderr and "with 2 of" not in result.stderr
