"""The handlers' part of a pass, without a cluster: they read what `decide` asks, once, and call
it again with what they read; they decide nothing themselves."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime

import kopf

from caramel.contract.api import CaramelJobStatus
from caramel.contract.jobfile import parse_job
from caramel_operator import handlers
from caramel_operator.cluster import ReadForbidden
from caramel_operator.gang_schedulers import PODGROUPS
from caramel_operator.lifecycle import CreateGroup, CreatePods, Observed

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
ALL = frozenset({"Service", "NetworkPolicy"})


class Cluster:
    """What the handlers read, recorded: no group, and no right to list the nodes."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    async def group(self, resource, namespace, name):
        self.reads.append(f"group {name}")
        return None

    async def serves(self, resource):
        self.reads.append(f"serves {resource}")
        return True

    async def nodes_and_pods(self):
        self.reads.append("nodes and pods")
        raise ReadForbidden('nodes is forbidden: cannot list resource "nodes"')


def job(**spec):
    return parse_job(
        {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": "demo", "namespace": "ns"}, "spec": {"script": "t.py", **spec}}
    )


def decided(the_job):
    memo = kopf.Memo(cluster=Cluster())
    decision = asyncio.run(handlers._decide(Observed(the_job, CaramelJobStatus(), [], ALL, NOW, handlers.SETTINGS), memo))
    return decision, memo.cluster.reads


def test_a_new_volcano_gang_gets_its_group_read_and_created_in_one_pass():
    decision, reads = decided(job(runPolicy={"schedulingPolicy": {"gangScheduler": "Volcano", "queue": "training"}}))
    assert reads == ["group demo-gang-0", f"serves {PODGROUPS}"]
    assert [a.manifest["metadata"]["name"] for a in decision.actions if isinstance(a, CreateGroup)] == ["demo-gang-0"]


def test_a_gang_whose_nodes_cannot_be_read_is_left_to_the_scheduler_and_created_in_one_pass():
    decision, reads = decided(job())
    assert reads == ["nodes and pods"]
    assert decision.status.placement.by == "Scheduler"
    assert [e.reason for e in decision.events] == ["PlacementUnavailable", "GangCreated"]
    [create] = [a for a in decision.actions if isinstance(a, CreatePods)]
    assert len(create.manifests) == 2


def test_the_handlers_leave_every_decision_to_the_lifecycle():
    """handlers._read_group worked out again, from the status and the pods, whether the gang
    waited for admission, and _read_progress whether the gang ran."""
    source = inspect.getsource(handlers)
    for deciding in ("gang_scheduler(", "group_name(", "WorkerState", "Phase.", "with_placement"):
        assert deciding not in source, deciding
