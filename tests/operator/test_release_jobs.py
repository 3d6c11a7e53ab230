"""A CRD being deleted releases every job from the operator's finalizer, also a job that changed
between the listing and the patch (caramel_operator.cluster.Cluster.release_job).

kube-apiserver answers a merge patch made from a stale resourceVersion with 409 Conflict; kmock's
emulator, which the operator tests run against, gives every update a new version and never
answers 409. So the API's custom-objects calls are stood in for here by a stub that answers the
first patch as kube-apiserver would after a concurrent write."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from kubernetes.client.exceptions import ApiException

from caramel_operator.cluster import Cluster

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def job(version: str, finalizers: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": "left", "namespace": "default", "resourceVersion": version, "finalizers": finalizers}}


class CustomObjects:
    """The job's stored copy at version 2 (its status written after the listing at version 1);
    a patch from another version is refused with 409."""

    def __init__(self) -> None:
        self.stored = job("2", [FINALIZER, "other.example/keep"])
        self.patches: list[dict[str, Any]] = []

    def list_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(data=json.dumps({"items": [job("1", [FINALIZER, "other.example/keep"])]}))

    def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(data=json.dumps(self.stored))

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any], **kwargs: Any) -> Any:
        self.patches.append(body)
        if body["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.stored["metadata"]["finalizers"] = body["metadata"]["finalizers"]
        return SimpleNamespace(data=json.dumps(self.stored))


def test_a_job_changed_since_it_was_listed_is_read_again_and_released():
    cluster = Cluster.__new__(Cluster)  # its API client stood in for (above)
    cluster.custom = CustomObjects()
    cluster._timeout = (1.0, 1.0)
    listed = json.loads(cluster.custom.list_cluster_custom_object().data)["items"][0]
    assert asyncio.run(cluster.release_job(listed, FINALIZER))
    assert cluster.custom.stored["metadata"]["finalizers"] == ["other.example/keep"]  # the other finalizer kept
    assert [patch["metadata"]["resourceVersion"] for patch in cluster.custom.patches] == ["1", "2"]
