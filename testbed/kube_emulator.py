"""A Kubernetes API emulator on a local port: kmock's KubernetesEmulator, serving the CaramelJob resource.

Run as `python -m testbed.kube_emulator URL_FILE [--forbid PLURAL ...]`; it writes its base URL
to URL_FILE and serves until SIGTERM. It stands in for kube-apiserver, which cannot run on these machines: it keeps
objects and serves real HTTP lists, watches, patches and deletes. On top of kmock it plays, in
their simplest form, the parts of a control plane the operator's behaviour depends on:
- the garbage collector: objects whose every owner is gone are deleted (background propagation);
- ResourceQuota's `pods` count: a pod beyond it is refused with 403 Forbidden, as quota
  admission refuses it;
- CRD life: the CaramelJob resource is served while its CRD exists; deleting the CRD deletes
  every CaramelJob (waiting for their finalizers) and only then the CRD and the resource;
- RBAC at its coarsest: `--forbid nodes` refuses every list of nodes with 403 Forbidden, as the
  API server refuses an operator whose Roles grant nothing cluster-scoped.
It has no scheduler, kubelet, label or field selectors, real RBAC, admission plugins (Pod
Security), CEL or OpenAPI validation: tests play the kubelet by patching pod status, and
testbed/crd_validation.py checks the CRD's rules offline.
"""

import argparse
import asyncio
import datetime
import secrets
import signal
import uuid
from pathlib import Path

import aiohttp
import attrs
import kmock
from kmock._internal import k8s

from caramel_operator.crd import PLURAL, SHORT_NAMES, SINGULAR, custom_resource_definition

JOBS_RESOURCE = "caramel.dev/v1alpha1/carameljobs"
CRD_NAME = f"{PLURAL}.caramel.dev"
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
CONTROL_LOOP_SECONDS = 0.2


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus what kube-apiserver fills in on every create, quota admission of
    pods, and the registration of the CaramelJob resource by its CRD.

    Names from metadata.generateName (kopf names its Events that way), a uid (owner references
    need it), a resourceVersion (kopf's JSON patches test it) and a creation time.
    """

    forbidden: frozenset[str] = frozenset()
    """Resources (plurals) that may not be listed, as RBAC would refuse them."""

    async def _handle(self, request: kmock.Request):
        if request.action == kmock.action.LIST and request.resource is not None and request.resource.plural in self.forbidden:
            plural = request.resource.plural
            raise k8s.KubernetesError(
                status=403,
                reason="Forbidden",
                message=f'{plural} is forbidden: User "system:serviceaccount:caramel-system:caramel-operator" cannot '
                f'list resource "{plural}" in API group "{request.resource.group}" at the cluster scope',
            )
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = metadata["generateName"] + secrets.token_hex(3)
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("resourceVersion", "1")
            metadata.setdefault("creationTimestamp", now())
            if request.resource is not None and request.resource.plural == "pods":
                self._admit_pod(request.namespace or metadata.get("namespace"), metadata["name"])
            if request.resource is not None and request.resource.plural == "customresourcedefinitions" and metadata["name"] == CRD_NAME:
                metadata["finalizers"] = [CRD_CLEANUP_FINALIZER]
                self._serve_jobs(True)
        return await super()._handle(request)

    def _admit_pod(self, namespace: str, name: str) -> None:
        for quota in self._live("resourcequotas", namespace):
            limit = ((quota.get("spec") or {}).get("hard") or {}).get("pods")
            used = len(self._live("pods", namespace))
            if limit is not None and used >= int(limit):
                quota_name = quota["metadata"]["name"]
                raise k8s.KubernetesError(
                    status=403,
                    reason="Forbidden",
                    message=f'pods "{name}" is forbidden: exceeded quota: {quota_name}, requested: pods=1, '
                    f"used: pods={used}, limited: pods={limit}",
                )

    def _live(self, plural: str, namespace: str | None = None) -> list:
        return [
            obj
            for (resource, ns, _), obj in self._objects.items()
            if resource.plural == plural and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def _serve_jobs(self, served: bool) -> None:
        if served:
            self.resources[JOBS_RESOURCE] = kmock.ResourceInfo(
                kind="CaramelJob",
                singular=SINGULAR,
                namespaced=True,
                shortnames=set(SHORT_NAMES),
                subresources={"status"},
                verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
            )
        elif JOBS_RESOURCE in self.resources:
            del self.resources[JOBS_RESOURCE]

    async def control_loop(self) -> None:
        """The garbage collector and the CRD clean-up, as controllers: every few hundred ms."""
        while True:
            await asyncio.sleep(CONTROL_LOOP_SECONDS)
            async with self._lock:
                await self._collect_garbage()
                await self._clean_up_deleted_crd()

    async def _collect_garbage(self) -> None:
        alive = {obj["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted}
        for (resource, _, _), obj in list(self._objects.items()):
            owners = [ref.get("uid") for ref in obj.get("metadata", {}).get("ownerReferences") or []]
            if not obj.deleted and owners and not any(uid in alive for uid in owners):
                await self._remove(resource, obj)

    async def _clean_up_deleted_crd(self) -> None:
        for (resource, _, name), crd in list(self._objects.items()):
            if resource.plural != "customresourcedefinitions" or name != CRD_NAME or crd.deleted:
                continue
            if not crd.get("metadata", {}).get("deletionTimestamp"):
                continue
            jobs = [(key, obj) for key, obj in self._objects.items() if key[0].plural == PLURAL and not obj.deleted]
            for (job_resource, _, _), job in jobs:
                await self._remove(job_resource, job)
            if not jobs:
                crd.patch({"metadata": {"finalizers": []}})
                crd.delete()
                await self._buses[resource].put({"type": "DELETED", "object": crd.last.raw})
                self._serve_jobs(False)
                for key in [key for key in self._objects if key[0].plural == PLURAL]:
                    del self._objects[key]  # kmock serves every resource it holds objects of

    async def _remove(self, resource, obj) -> None:
        """Delete as the API server does: wait for finalizers, else remove now; tell the watchers."""
        if obj.get("metadata", {}).get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj.patch({"metadata": {"deletionTimestamp": now()}})
                await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
        else:
            obj.delete()
            await self._buses[resource].put({"type": "DELETED", "object": obj.last.raw})


async def serve(url_file: Path, forbidden: frozenset[str]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with ApiServerEmulator(forbidden=forbidden) as emulator:
        emulator.resources.load_bundled()
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            async with aiohttp.ClientSession() as session:
                crds = f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
                async with session.post(crds, json=custom_resource_definition()) as response:
                    assert response.status < 300, await response.text()
            controllers = asyncio.create_task(emulator.control_loop())
            url_file.write_text(url)
            await stop.wait()
            controllers.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A Kubernetes API emulator serving the CaramelJob resource.")
    parser.add_argument("url_file", type=Path, help="where to write the emulator's base URL")
    parser.add_argument("--forbid", action="append", default=[], metavar="PLURAL", help="refuse lists of this resource (403)")
    arguments = parser.parse_args()
    asyncio.run(serve(arguments.url_file, frozenset(arguments.forbid)))
