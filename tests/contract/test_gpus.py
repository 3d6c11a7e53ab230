"""One GPU per rank: which GPUs a worker's training processes see and which one each trains on
(caramel.contract.gpus), and how the runtime narrows TensorFlow to it (caramel.tensorflow.devices),
with real TensorFlow, which finds no GPU on these machines: the GPU side of the rule is checked
through its pure parts and TensorFlow's own rule for a choice taken again."""

from __future__ import annotations

import pytest
import tensorflow as tf

from caramel.contract.api import CaramelJob
from caramel.contract.env import WorkerContract, slot_env, worker_env
from caramel.contract.gpus import GPUS_PER_WORKER, NoGpuError, rank_gpu, worker_devices
from caramel.tensorflow.devices import training_device


def job(gpus: int | None = None, slots: int | None = None, replicas: int = 2) -> CaramelJob:
    workers = {"replicas": replicas, **({"slotsPerWorker": slots} if slots else {})}
    if gpus is not None:
        workers["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return CaramelJob.model_validate({"metadata": {"name": "gpu"}, "spec": {"script": "t.py", "workers": workers}})


def test_a_pod_sees_its_own_gpus_and_workers_sharing_a_machine_take_a_block_each():
    pods = ["gpu-worker-0.gpu.default.svc", "gpu-worker-1.gpu.default.svc"]
    assert [worker_devices(None, pods, index, 2) for index in (0, 1)] == ["0,1", "0,1"]
    shared = ["127.0.0.1"] * 3
    assert [worker_devices(None, shared, index, 2) for index in (0, 1, 2)] == ["0,1", "2,3", "4,5"]
    # The machine's own list (CUDA_VISIBLE_DEVICES where `caramel run` starts) is what they share.
    assert [worker_devices("4,5,6,7", shared, index, 2) for index in (0, 1, 2)] == ["4,5", "6,7", ""]
    assert worker_devices("GPU-8a1b, GPU-77c2", shared[:2], 1, 1) == "GPU-77c2"
    # A job that asks for no GPU sees none, wherever it runs.
    assert worker_devices(None, pods, 0, 0) == worker_devices("0,1", shared, 1, 0) == ""


def test_each_rank_trains_on_the_gpu_of_its_local_rank_and_a_rank_without_one_fails_naming_the_field():
    assert [rank_gpu(local_rank, 4, 4) for local_rank in range(4)] == [0, 1, 2, 3]
    assert rank_gpu(0, 0, 8) is None  # no GPU asked: the CPU, whatever the machine has
    with pytest.raises(NoGpuError, match=r"local rank 1 finds 1 GPU\(s\) where its job asks for 2 per worker \(spec\.workers\.resources\.limits nvidia\.com/gpu\)"):
        rank_gpu(1, 2, 1)
    with pytest.raises(NoGpuError, match="local rank 0 finds no GPU"):
        rank_gpu(0, 1, 0)


def test_the_gpu_count_reaches_every_training_process_with_its_local_rank():
    env = worker_env(job(gpus=2), 1, ["a", "b"])
    assert env[GPUS_PER_WORKER] == "2" and env["HOROVOD_LOCAL_SIZE"] == "2"
    contract = WorkerContract.from_env({**env, **slot_env(env, 1)})
    assert (contract.gpus_per_worker, contract.required_rank, contract.local_rank) == (2, 3, 1)
    cpu_env = worker_env(job(), 0, ["a", "b"])
    assert GPUS_PER_WORKER not in cpu_env and WorkerContract.from_env({**cpu_env, **slot_env(cpu_env, 0)}).gpus_per_worker == 0


def contract_of(the_job: CaramelJob, slot: int = 0) -> WorkerContract:
    env = worker_env(the_job, 0, ["a"] * the_job.spec.workers.replicas)
    return WorkerContract.from_env({**env, **slot_env(env, slot)})


def test_with_real_tensorflow_which_finds_no_gpu_here_a_gpu_job_fails_at_init_and_a_cpu_job_trains_on():
    assert tf.config.list_physical_devices("GPU") == []  # these machines have none: the test says what it checks
    with pytest.raises(NoGpuError, match="local rank 1 finds no GPU where its job asks for 2 per worker"):
        training_device(contract_of(job(gpus=2), slot=1))
    said = training_device(contract_of(job()))
    # TensorFlow's CPU build (make setup) says nothing; the GPU image's says why the CPU.
    assert said == ("no GPU: the job asks for none (spec.workers.resources.limits nvidia.com/gpu), so the ranks train on the CPU"
                    if tf.test.is_built_with_cuda() else "")


def test_tensorflow_takes_a_device_choice_made_again_after_it_started_as_no_change():
    """What makes Horovod's `set_visible_devices(gpus[hvd.local_rank()], "GPU")` after hvd.init()
    work under Caramel, whose init starts TensorFlow having made that same choice: TensorFlow's rule,
    shown on the CPU, the one device here."""
    tf.constant(1.0)  # TensorFlow has started
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_visible_devices(cpus[0], "CPU")
    tf.config.set_visible_devices(cpus, "CPU")
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        tf.config.set_visible_devices([], "CPU")
