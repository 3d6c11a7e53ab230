"""The one seam through which the benchmarks and tests plan with another policy than Caramel's own
(`caramel.tensorflow.runtime.plan_with`, testbed/lab.py): it comes before the runtime, whose
communicator builds its replanner (and so the plan searches) with it; otherwise Caramel's own."""

from __future__ import annotations

import pytest

from caramel.contract.api import CaramelJob
from caramel.contract.env import WorkerContract, slot_env, worker_env
from caramel.planner.policy import Collective, Ordering, PlanningPolicy
from caramel.tensorflow import runtime
from caramel.tensorflow.communicator import GradientCommunicator


def contract() -> WorkerContract:
    job = CaramelJob.model_validate(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "policy"},
         "spec": {"script": "train.py", "workers": {"replicas": 1}}}
    )  # fmt: skip
    env = worker_env(job, 0, ["a"])
    return WorkerContract.from_env({**env, **slot_env(env, 0)})


def test_the_communicator_plans_by_the_policy_it_is_built_with(one_rank):
    assert GradientCommunicator(contract(), one_rank).control.replanner.policy == PlanningPolicy()
    arrival = PlanningPolicy(ordering=Ordering.ARRIVAL, first_plan_waits=True)
    assert GradientCommunicator(contract(), one_rank, arrival).control.replanner.policy is arrival


def test_split_collectives_are_refused_on_a_backend_without_reduce_scatter(one_rank):
    with pytest.raises(ValueError, match="the planning policy's collective split needs reduce-scatter, which the tensorflow backend has not"):
        GradientCommunicator(contract(), one_rank, PlanningPolicy(collective=Collective.SPLIT))


def test_a_policy_is_given_before_the_runtime_is_made(monkeypatch):
    monkeypatch.setattr(runtime, "_runtime", object())  # as after init()
    with pytest.raises(RuntimeError, match=r"plan_with comes before caramel.tensorflow.init\(\)"):
        runtime.plan_with(PlanningPolicy(ordering=Ordering.ARRIVAL))
    assert runtime._policy == PlanningPolicy()
