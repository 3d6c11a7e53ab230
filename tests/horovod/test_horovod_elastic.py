"""Horovod's elastic API as Caramel serves it (`horovod.tensorflow.elastic`,
runtime/caramel/compat/horovod): its states commit, restore and refuse what they cannot keep, in
one training process; and, end to end under `caramel run` on the horovod backend, a gang that
loses a worker mid-run rolls back to its last commit, re-forms in its processes without it, takes
it back, and ends with the same weights on every rank."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import yaml

from caramel.contract.env import slot_env, worker_env
from caramel.contract.jobfile import parse_job
from caramel.launch.entrypoint import HOROVOD_API_DIR
from conftest import RACKS_TOPOLOGY, REPO, free_port, job_manifest, keras_env, needs_horovod, write_manifest
from testbed.local_runs import BackgroundRun, digests

EXAMPLES = REPO / "examples" / "horovod"


def run_one_rank(code: str, workers: dict, backend: str = "tensorflow") -> subprocess.CompletedProcess[str]:
    """The code as the training process of worker 0 of a job of `workers`, run alone (as its
    first worker: nothing here needs the others)."""
    job = parse_job({
        "apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "unit"},
        "spec": {"command": ["python"], "workers": workers, "metrics": {"enabled": False},
                 "rendezvous": {"port": free_port()}, "caramel": {"backend": backend}, "env": keras_env(3)},
    })  # fmt: skip
    env = {**os.environ, **worker_env(job, 0, ["127.0.0.1"])}
    env.update(slot_env(env, 0))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HOROVOD_API_DIR, os.environ.get("PYTHONPATH")]))  # as the entrypoint puts it
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


MODEL = """
    import threading
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    model.build((None, 3))
    opt = tf.keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)

    def refused(call):
        try:
            call()
        except (TypeError, NotImplementedError) as error:
            print(error)
"""


def refusals(code: str, workers: dict) -> str:
    """What the code (after MODEL) printed: the refusals' messages."""
    result = run_one_rank(MODEL + code, workers)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_commit_is_what_a_restore_rolls_back_to_variables_and_objects_alike():
    result = run_one_rank(MODEL + """
    state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0, seen=[])
    committed = [v.numpy().copy() for v in model.variables]
    state.batch, state.seen = 5, [1, 2]
    state.commit()
    committed = [v.numpy().copy() for v in model.variables]
    for v in model.variables:
        v.assign_add(tf.ones_like(v))
    state.batch = 9
    state.seen.append(3)   # a commit copies: changing the object in place is undone too
    state.restore()
    assert all((v.numpy() == c).all() for v, c in zip(model.variables, committed))
    assert (state.batch, state.seen) == (5, [1, 2]), (state.batch, state.seen)

    calls = []
    @hvd.elastic.run
    def train(state, steps):
        calls.append(steps)
        return "done"
    assert train(state, 3) == "done" and calls == [3]
    print("ok")
    """, {"replicas": 1})
    assert result.returncode == 0, result.stderr[-3000:]
    # An elastic script in a gang that cannot run short is a fixed gang, and rank 0 says so once.
    assert result.stderr.count("runs as a fixed gang") == 1, result.stderr[-3000:]


def test_a_commit_that_cannot_be_kept_fails_naming_the_object():
    printed = refusals("""
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0, lock=None)
    state.lock = threading.Lock()
    refused(state.commit)
    refused(lambda: hvd.elastic.TensorFlowKerasState(model, opt, lock=threading.Lock()))
    """, {"replicas": 1})
    assert "state.commit(): state.lock (lock) cannot be committed: an elastic state's attributes must pickle" in printed
    assert "hvd.elastic state: state.lock (lock) cannot be committed" in printed


def test_a_failed_steps_frames_are_freed_aside_so_that_the_survivors_meet_at_once():
    """What a lost peer's failure holds (a Keras fit's frames, with its data iterator, whose
    threads can take seconds to stop) is freed in a thread of its own, not on the way to the rendezvous."""
    result = run_one_rank("""
    import threading, time
    from horovod.tensorflow.elastic import _let_go_aside
    freed_in = []
    class DataIterator:
        def __del__(self):
            time.sleep(0.5)
            freed_in.append(threading.current_thread().name)
    def step():
        iterator = DataIterator()
        raise RuntimeError("a peer was lost")
    failure = []
    try:
        step()
    except RuntimeError as error:
        failure.append(error)
    _let_go_aside(failure)
    assert not freed_in, "freed on the main thread"
    deadline = time.monotonic() + 30
    while not freed_in and time.monotonic() < deadline:
        time.sleep(0.05)
    print("freed in", freed_in)
    """, {"replicas": 1})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "freed in ['caramel-failed-step']" in result.stdout, result.stdout[-3000:]


def test_elastic_with_caramels_own_training_run_is_refused_saying_which_to_use():
    printed = refusals("""
    from caramel.tensorflow.training import TrainingRun
    TrainingRun(model, opt, total_steps=1, batch_size=1)
    refused(lambda: hvd.elastic.run(lambda state: None)(hvd.elastic.TensorFlowKerasState(model, opt)))
    """, {"replicas": 1})
    assert "hvd.elastic.run in a script that uses TrainingRun is not supported by Caramel" in printed
    assert "train either with hvd.elastic" in printed


def test_a_state_of_the_scripts_own_is_refused_where_the_ranks_re_form_by_restarting():
    printed = refusals("""
    class Counter(hvd.elastic.State):
        def save(self): pass
        def restore(self): pass
        def sync(self): pass
    refused(lambda: hvd.elastic.run(lambda state: None)(Counter(hvd.broadcast_object, hvd.rank)))
    hvd.elastic.run(lambda state: print("trained from batch", state.batch))(hvd.elastic.TensorFlowKerasState(model, opt, batch=0))
    """, {"replicas": 2, "minReplicas": 1})
    assert "hvd.elastic.run with a State of the script's own (Counter) on the tensorflow backend is not supported by Caramel" in printed
    assert "trained from batch 0" in printed


def test_a_commit_carried_across_a_restart_is_taken_back_and_refused_where_the_variables_differ():
    """What a process restarted to re-form takes back (on the tensorflow backend): its former
    self's last commit, variables and objects, and the reset callbacks run after it."""
    printed = refusals("""
    from horovod.tensorflow.functions import _pickler
    state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0)
    for v in model.variables:
        v.assign(tf.ones_like(v))
    state.batch = 7
    state.commit()
    carried = _pickler.loads(_pickler.dumps(state._caramel_carried()))
    for v in model.variables:
        v.assign(tf.zeros_like(v))
    state.batch = 9
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.batch)])
    state._caramel_resume(carried)
    state.on_reset()
    assert all((v.numpy() == 1).all() for v in model.variables) and state.batch == 7 and resets == [7], resets
    print("resumed")
    try:
        hvd.elastic.TensorFlowState([model.variables[0]], batch=0)._caramel_resume(carried)
    except RuntimeError as error:
        print(error)
    """, {"replicas": 1})
    assert "resumed" in printed
    assert "the script must make the same variables each time it starts" in printed


# -- end to end ----------------------------------------------------------------------------------

STEP = re.compile(r"rank 0 \| Step #(\d+)\s+Loss: \S+\s+ranks (\d+)\s+([\d.]+)")


def steps_of(output: str) -> list[tuple[int, int, float]]:
    """Rank 0's steps, in the order logged: (step, ranks, time)."""
    return [(int(step), int(ranks), float(at)) for step, ranks, at in STEP.findall(output)]


@pytest.mark.recovery
@pytest.mark.e2e
@needs_horovod
@pytest.mark.timeout(600)
def test_an_elastic_gang_loses_a_worker_rolls_back_to_its_last_commit_and_takes_it_back(tmp_path):
    commit_every = 5
    example = yaml.safe_load((EXAMPLES / "mnist_elastic.yaml").read_text())
    manifest = job_manifest(
        name="elastic",
        script=str(EXAMPLES / "mnist_elastic.py"),
        args=["--steps", "400", "--batch-size", "16", "--commit-every", str(commit_every), "--log-every", "1"],
        env=example["spec"]["env"],
        caramel={"backend": "horovod"},
        workers={"replicas": 3, "minReplicas": 2},
        runPolicy={"backoffLimit": 2},
    )
    run = BackgroundRun(write_manifest(tmp_path, manifest))
    run.wait_for(re.compile(r"rank 0 \| Step #(2\d|[3-9]\d) "), timeout=300)
    run.training_process(2).send_signal(signal.SIGKILL)
    killed_at = time.time()
    assert run.finish(timeout=500) == 0, run.output[-6000:]
    output = run.output
    assert output.count("caramel: elastic gang of 3 workers, down to 2") == 1, output[-6000:]
    assert "worker 2 exited with code 137: the elastic gang goes on without it" in output  # its rank's SIGKILL, passed on
    assert "restarting the whole gang" not in output and "Succeeded elastic" in output
    steps = steps_of(output)
    before = [step for step, ranks, at in steps if at < killed_at]
    after = [(step, ranks, at) for step, ranks, at in steps if at >= killed_at]
    # The survivors roll back to their last commit: they lose at most the steps since it.
    first_step, first_ranks, first_at = after[0]
    rolled_back_to = first_step - 1
    assert rolled_back_to % commit_every == 0 and max(before) - rolled_back_to <= commit_every, (max(before), after[0])
    resumed_seconds = first_at - killed_at
    print(f"\nkill -> first step after re-forming: {resumed_seconds:.1f} s, at {first_ranks} ranks (step {first_step}; {max(before)} logged before the kill)")
    assert resumed_seconds < 15, resumed_seconds
    # The lost worker, started again, rejoins at once (the re-formed ranks take it in) or at a
    # commit after the survivors went on without it: the gang ends whole, every rank alike.
    assert "ranks re-formed in round" in output
    assert steps[-1][:2] == (400, 3), steps[-1]
    final = digests(output)
    assert sorted(final) == [0, 1, 2] and len(set(final.values())) == 1, final


@pytest.mark.recovery
@pytest.mark.e2e
@needs_horovod
@pytest.mark.timeout(600)
@pytest.mark.parametrize("keras", [3, 2], ids=["keras3", "keras2"])
def test_the_elastic_keras_example_loses_a_worker_mid_fit_and_ends_whole(tmp_path, keras):
    manifest = job_manifest(
        name="keras-elastic",
        script=str(EXAMPLES / "keras_mnist_elastic.py"),
        # Four epochs after the kill: the survivors may re-form at 2 ranks before the lost worker is
        # back, and it then joins at a commit; a shorter fit once ended first on a loaded machine.
        args=["--epochs", "6", "--steps-per-epoch", "60", "--batch-size", "16", "--batches-per-commit", "5"],
        env=keras_env(keras),
        caramel={"backend": "horovod"},
        workers={"replicas": 3, "minReplicas": 2},
        runPolicy={"backoffLimit": 2},
    )
    run = BackgroundRun(write_manifest(tmp_path, manifest))
    run.wait_for("Epoch 2/6", timeout=300)
    time.sleep(3)  # inside the second epoch
    run.training_process(2).send_signal(signal.SIGKILL)
    assert run.finish(timeout=500) == 0, run.output[-6000:]
    assert "worker 2 exited with code 137: the elastic gang goes on without it" in run.output
    assert "ranks re-formed in round" in run.output and "restarting the whole gang" not in run.output
    # fit goes on for the epochs left after the last commit's: the first epoch is not run again.
    after = run.output.split("ranks re-formed in round")[1]
    assert re.search(r"Epoch 1/[1-5]\n", after) and "Epoch 1/6" not in after, run.output[-3000:]
    final = digests(run.output)
    assert sorted(final) == [0, 1, 2] and len(set(final.values())) == 1, final


# Synchronous SGD on a linear model whose every rank's batch is a function of the step and the
# rank: each step's update depends only on the weights and on how many ranks took part, which
# rank 0 logs. A worker that comes back waits before it joins (CARAMEL_ROUND=join: its worker
# came back), so that the survivors train at the smaller size first.
BATCH = """
import numpy as np
DIM = 8

def batch(step, rank):
    grid = np.arange(16 * DIM, dtype=np.float32).reshape(16, DIM)
    x = np.sin(grid * 0.01 * (step + 1) + rank * 0.7).astype(np.float32)
    y = (x @ np.linspace(-1.0, 1.0, DIM, dtype=np.float32)).astype(np.float32)
    return x, y
"""
ELASTIC_SGD = BATCH + """
import json, os, sys, time
import tensorflow as tf
import horovod.tensorflow as hvd
from caramel.contract.env import WorkerContract
from caramel.network.wire import job_topology

if os.environ.get("CARAMEL_ROUND") == "join":
    time.sleep(12)
hvd.init()
STEPS = int(sys.argv[1])
w = tf.Variable(tf.zeros([DIM]))

@tf.function
def step_fn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.linalg.matvec(x, w) - y) ** 2)
    grad = hvd.DistributedGradientTape(tape).gradient(loss, [w])[0]
    w.assign_sub(0.05 * grad)
    return loss

@hvd.elastic.run
def train(state):
    while state.batch < STEPS:
        step_fn(*batch(state.batch, hvd.rank()))
        if hvd.rank() == 0:
            print(f"SGD step {state.batch} ranks {hvd.size()} on {','.join(job_topology(WorkerContract.from_env()).hosts)}", flush=True)
        state.batch += 1
        time.sleep(0.15)
        if state.batch % 2 == 0:
            state.commit()

state = hvd.elastic.TensorFlowState([w], batch=0)
train(state)
if hvd.rank() == 0:
    print("SGD weights " + json.dumps(w.numpy().tolist()), flush=True)
"""


def reference_weights(sizes: dict[int, int], steps: int) -> np.ndarray:
    """The same SGD in this process, step s averaging the gradients of ranks 0 .. sizes[s] - 1."""
    namespace: dict = {}
    exec(BATCH, namespace)
    batch = namespace["batch"]
    w = np.zeros(8, np.float32)
    for step in range(steps):
        grads = []
        for rank in range(sizes[step]):
            x, y = batch(step, rank)
            grads.append(2 * x.T @ (x @ w - y) / len(y))
        w = w - np.float32(0.05) * np.mean(grads, axis=0, dtype=np.float32)
    return w


@pytest.mark.recovery
@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", [pytest.param("horovod", marks=needs_horovod), "tensorflow"])
def test_an_elastic_run_that_shrinks_and_grows_back_ends_as_sgd_at_the_same_per_step_sizes(tmp_path, backend):
    """On the horovod backend the ranks re-form in their processes; on the tensorflow backend the
    survivors' processes restart to re-form, each with its last commit: the same SGD either way.
    With a topology (a rack of two hosts per two workers), as the operator's placement gives one:
    the ranks without worker 2 run on the hosts of workers 0, 1 and 3 (issue 50). `auto` would
    take MULTITREE's trees on it, but not for ranks that re-form, which the trees cannot follow."""
    steps = 160
    script = tmp_path / "elastic_sgd.py"
    script.write_text(ELASTIC_SGD)
    topology = tmp_path / "racks.yaml"
    topology.write_text(RACKS_TOPOLOGY)
    manifest = job_manifest(
        name="elastic-sgd", script=str(script), args=[str(steps)], caramel={"backend": backend},
        workers={"replicas": 4, "minReplicas": 3}, runPolicy={"backoffLimit": 2},
    )  # fmt: skip
    run = BackgroundRun(write_manifest(tmp_path, manifest), topology)
    run.wait_for(re.compile(r"SGD step (2\d|[3-9]\d) "), timeout=300)
    run.training_process(2).send_signal(signal.SIGKILL)
    assert run.finish(timeout=500) == 0, run.output[-6000:]
    worlds = set(re.findall(r"rank 0 \| SGD step \d+ ranks (\d+) on (\S+)", run.output))
    assert worlds == {("4", "r0-h0,r0-h1,r1-h0,r1-h1"), ("3", "r0-h0,r0-h1,r1-h1")}, worlds
    assert "caramel: gradients all-reduced by ring (spec.caramel.allreduce: auto): this gang may run short" in run.output, run.output[-6000:]
    sizes: dict[int, int] = {}
    for step, ranks in re.findall(r"rank 0 \| SGD step (\d+) ranks (\d+)", run.output):
        sizes[int(step)] = int(ranks)  # a step rolled back and run again counts as it ran last
    assert sorted(sizes) == list(range(steps))
    seen = [sizes[step] for step in range(steps)]
    assert 3 in seen and seen[0] == seen[-1] == 4, seen  # 4 ranks, 3 after the loss, 4 again once it came back
    trained = np.array(json.loads(re.search(r"SGD weights (\[.*\])", run.output).group(1)), np.float32)
    np.testing.assert_allclose(trained, reference_weights(sizes, steps), rtol=1e-4, atol=1e-6)
    final = digests(run.output)
    assert sorted(final) == [0, 1, 2, 3] and len(set(final.values())) == 1, final
    restarted = run.output.count("their training processes restarted with the last commit")
    assert restarted == (2 if backend == "tensorflow" else 0), run.output[-6000:]  # once to shrink, once to grow
