"""A Kubernetes API emulator on a local port: kmock's KubernetesEmulator, serving the CaramelJob resource.

Run as `python -m testbed.kube_emulator URL_FILE [--forbid PLURAL ...] [--discovery-lag SECONDS]
[--record FILE]`; it writes its base URL to URL_FILE and serves until SIGTERM. It stands in for kube-apiserver, which cannot run on these machines: it keeps
objects and serves real HTTP lists, watches, patches and deletes. On top of kmock it plays, in
their simplest form, the parts of a control plane the operator's behaviour depends on:
- the garbage collector: objects whose every owner is gone are deleted (background propagation);
- ResourceQuota's `pods` count: a pod beyond it is refused with 403 Forbidden, as quota
  admission refuses it;
- CRD life: the CaramelJob resource is served while its CRD exists; deleting the CRD marks it
  Terminating (a condition, and discovery lists the resource without create, patch and update,
  as kube-apiserver's discovery does for a terminating CRD), a second later deletes every
  CaramelJob (waiting for their finalizers) and only then the CRD and the resource. The second
  lets the discovery change reach kopf first, which then stops watching the jobs and never sees
  them deleted: what the operator saw on v1.36;
- other CRDs (a gang scheduler's, such as Volcano's PodGroup): their resources are served from
  their creation, and a resource of an API group that neither a CRD nor Kubernetes serves is
  answered 404, as kube-apiserver answers (kmock would store objects of any resource asked for);
- RBAC at its coarsest: `--forbid nodes` refuses every list of nodes with 403 Forbidden, as the
  API server refuses an operator whose Roles grant nothing cluster-scoped.
And what tests of the operator's robustness need:
- discovery that lags the CRD: with `--discovery-lag`, the API's discovery lists CaramelJobs only
  that long after their CRD's creation, and so after the CRD's last event (kube-apiserver's
  discovery controller works asynchronously: seen on v1.36 after a CRD was re-created);
- stalled requests: POST /testbed/stall with {"method", "path" (a regular expression searched in
  the URL's path), "name" (optional: one searched in the object's name, from the path or the
  body), "watch" (optional: only watches, or no watches), "seconds", "when"} holds every matching
  request that long before handling it ("before": a call, or a watch that delivers nothing,
  hanging) or after ("after": done, but answered late);
- a record of the requests with `--record FILE`: a JSON line each, with the Kubernetes verb, API
  group and resource, and the client's User-Agent, for comparing RBAC rules with what is used.
It has no scheduler, kubelet, label or field selectors, real RBAC, admission plugins (Pod
Security), CEL or OpenAPI validation: tests play the kubelet by patching pod status, and
testbed/crd_validation.py checks the CRD's rules offline.
"""

import argparse
import asyncio
import datetime
import json
import re
import secrets
import signal
import uuid
from pathlib import Path

import aiohttp
import attrs
import jsonpatch
import kmock
from kmock._internal import k8s

from caramel_operator.crd import PLURAL, SHORT_NAMES, SINGULAR, custom_resource_definition

JOBS_RESOURCE = "caramel.dev/v1alpha1/carameljobs"
SERVED_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
# What discovery lists for the resource of a terminating CRD: no new objects, no changes.
TERMINATING_VERBS = SERVED_VERBS - {"create", "patch", "update"}
CRD_NAME = f"{PLURAL}.caramel.dev"
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
CONTROL_LOOP_SECONDS = 0.2
# From a CRD's Terminating condition to the deletion of its objects.
TERMINATING_SECONDS = 1.0


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus what kube-apiserver fills in on every create, quota admission of
    pods, and the registration of the CaramelJob resource by its CRD.

    Names from metadata.generateName (kopf names its Events that way), a uid (owner references
    need it) and a creation time; and a resourceVersion that, as etcd's revision, is new at every
    create and change of any object (kopf's JSON patches test it; the operator's liveness probe
    compares the versions its watch delivered with those the API server lists).
    """

    forbidden: frozenset[str] = frozenset()
    """Resources (plurals) that may not be listed, as RBAC would refuse them."""

    discovery_lag: float = 0.0
    """Seconds after the CRD's creation before discovery lists its resource."""

    record: Path | None = None
    """Where to append a line per request (verb, group, resource, User-Agent)."""

    stalls: list[dict] = attrs.field(factory=list)
    """The rules of POST /testbed/stall."""

    revision: int = 0
    """The last resourceVersion given to an object."""

    terminating_since: float | None = None
    """When the CaramelJob CRD was marked Terminating (the event loop's time), while it is."""

    async def _handle(self, request: kmock.Request):
        if request.url.path == "/testbed/stall":
            self.stalls.append(request.data)
            return aiohttp.web.json_response({"stalls": self.stalls})
        self._record(request)
        stalls = [rule for rule in self.stalls if self._stalls(rule, request)]
        for rule in stalls:
            if rule.get("when", "before") == "before":
                await asyncio.sleep(rule["seconds"])
        response = await self._respond(request)
        for rule in stalls:
            if rule.get("when") == "after":
                await asyncio.sleep(rule["seconds"])
        return response

    @staticmethod
    def _stalls(rule: dict, request: kmock.Request) -> bool:
        watch = request.action == kmock.action.WATCH
        body = request.data if isinstance(request.data, dict) else {}
        name = request.name or (body.get("metadata") or {}).get("name") or ""
        return (
            request.method.value.upper() == rule["method"].upper()
            and re.search(rule["path"], request.url.path) is not None
            and re.search(rule.get("name", ""), name) is not None
            and rule.get("watch", watch) == watch
        )

    def _record(self, request: kmock.Request) -> None:
        if self.record is None or request.resource is None or not request.resource.plural:
            return  # discovery, which everyone may read
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete" if request.name else "deletecollection"}.get(
            request.method.value.upper()
        ) or {kmock.action.WATCH: "watch", kmock.action.LIST: "list"}.get(request.action, "get")  # type: ignore[arg-type]  # no action (None) reads as "get", .get's default
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        line = {"verb": verb, "group": request.resource.group or "", "resource": resource, "agent": request.headers.get("User-Agent", "")}
        with self.record.open("a") as record:
            record.write(json.dumps(line) + "\n")

    async def _respond(self, request: kmock.Request):
        if request.resource is not None and request.resource.plural and not self._serves(request.resource.group):
            raise k8s.KubernetesError(status=404, reason="NotFound", message="the server could not find the requested resource")
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
            metadata["resourceVersion"] = self._next_version()
            metadata.setdefault("creationTimestamp", now())
            if request.resource is not None and request.resource.plural == "pods":
                self._admit_pod(request.namespace or metadata.get("namespace"), metadata["name"])
            if request.resource is not None and request.resource.plural == "customresourcedefinitions":
                if metadata["name"] == CRD_NAME:
                    metadata["finalizers"] = [CRD_CLEANUP_FINALIZER]
                    asyncio.get_running_loop().call_later(self.discovery_lag, self._serve_jobs, True)
                else:
                    self._serve_crd(request.data)
        if request.action == kmock.action.UPDATE and request.name:
            version = self._next_version()
            if isinstance(request.data, list):  # a JSON patch: after its ops, which may test the version before
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            elif isinstance(request.data, dict):
                request.data.setdefault("metadata", {})["resourceVersion"] = version
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchException as error:
            # As kube-apiserver answers a JSON patch it cannot apply, a failed test among them
            # (kopf's patches test the resourceVersion they were made from, and retry after a 422).
            raise k8s.KubernetesError(status=422, reason="Invalid", message=f"the JSON patch cannot be applied: {error}") from None

    def _serves(self, group: str | None) -> bool:
        """Whether the API serves resources of the group: Kubernetes' own (kmock's bundled ones), a
        CRD's, or CaramelJobs' (whose CRD's life is played out above)."""
        return group == "caramel.dev" or any(resource.group == (group or "") for resource in self._get_resources())

    def _serve_crd(self, crd: dict) -> None:
        """Serve the resource of a CRD other than CaramelJob's, in each of its served versions."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if version.get("served", True):
                self.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular"),
                    namespaced=spec.get("scope") == "Namespaced",
                    shortnames=set(names.get("shortNames") or []),
                    subresources={"status"},
                    verbs=SERVED_VERBS,
                )

    def _next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

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

    def _serve_jobs(self, served: bool, verbs: set[str] = SERVED_VERBS) -> None:
        if served:
            self.resources[JOBS_RESOURCE] = kmock.ResourceInfo(
                kind="CaramelJob",
                singular=SINGULAR,
                namespaced=True,
                shortnames=set(SHORT_NAMES),
                subresources={"status"},
                verbs=verbs,
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
            now_seconds = asyncio.get_running_loop().time()
            if self.terminating_since is None:
                # As apiextensions' finalizer controller, before it deletes the CRD's objects.
                self.terminating_since = now_seconds
                conditions = [*((crd.get("status") or {}).get("conditions") or []), {"type": "Terminating", "status": "True", "reason": "InstanceDeletionInProgress"}]
                crd.patch({"metadata": {"resourceVersion": self._next_version()}, "status": {"conditions": conditions}})
                await self._buses[resource].put({"type": "MODIFIED", "object": crd.raw})
                self._serve_jobs(True, TERMINATING_VERBS)
            if now_seconds - self.terminating_since < TERMINATING_SECONDS:
                continue
            jobs = [(key, obj) for key, obj in self._objects.items() if key[0].plural == PLURAL and not obj.deleted]
            for (job_resource, _, _), job in jobs:
                await self._remove(job_resource, job)
            if not jobs:
                crd.patch({"metadata": {"finalizers": []}})
                crd.delete()
                await self._buses[resource].put({"type": "DELETED", "object": crd.last.raw})
                self.terminating_since = None
                self._serve_jobs(False)
                for key in [key for key in self._objects if key[0].plural == PLURAL]:
                    del self._objects[key]  # kmock serves every resource it holds objects of

    async def _remove(self, resource, obj) -> None:
        """Delete as the API server does: wait for finalizers, else remove now; tell the watchers."""
        if obj.get("metadata", {}).get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj.patch({"metadata": {"deletionTimestamp": now(), "resourceVersion": self._next_version()}})
                await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
        else:
            obj.delete()
            await self._buses[resource].put({"type": "DELETED", "object": obj.last.raw})


async def serve(url_file: Path, forbidden: frozenset[str], discovery_lag: float, record: Path | None) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with ApiServerEmulator(forbidden=forbidden, discovery_lag=discovery_lag, record=record) as emulator:
        emulator.resources.load_bundled()
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            async with aiohttp.ClientSession() as session:
                crds = f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
                async with session.post(crds, json=custom_resource_definition()) as response:
                    assert response.status < 300, await response.text()
            await asyncio.sleep(discovery_lag)  # the operator starts against a served CRD
            controllers = asyncio.create_task(emulator.control_loop())
            url_file.write_text(url)
            await stop.wait()
            controllers.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A Kubernetes API emulator serving the CaramelJob resource.")
    parser.add_argument("url_file", type=Path, help="where to write the emulator's base URL")
    parser.add_argument("--forbid", action="append", default=[], metavar="PLURAL", help="refuse lists of this resource (403)")
    parser.add_argument("--discovery-lag", type=float, default=0.0, metavar="SECONDS", help="list CaramelJobs in discovery this long after their CRD is created")
    parser.add_argument("--record", type=Path, metavar="FILE", help="append a JSON line per request: verb, group, resource, User-Agent")
    arguments = parser.parse_args()
    asyncio.run(serve(arguments.url_file, frozenset(arguments.forbid), arguments.discovery_lag, arguments.record))
