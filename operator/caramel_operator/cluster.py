"""The operator's writes to the Kubernetes API, the reads placement needs, and its scrapes of
workers' metrics.

The kubernetes client is synchronous: every call runs in a worker thread so that kopf's event
loop keeps serving other jobs. Every call has a connect and a request timeout (the client waits
forever by default): a hung call would hold its thread, and a few of them every thread of the
pool that all calls share, which stops every job's reconciliation. Responses are not deserialized
(`_preload_content=False`): the operator needs none of them, and skipping it saves time at
hundreds of pods. Creations that find
the object already there and deletions that find it gone count as done, which makes every action
safe to repeat after an operator restart. Other refusals of a creation (Pod Security, quota,
admission webhooks, RBAC) are returned as the API server's messages, for the job's status.

The rights these calls and kopf's need are rbac.py's rules, from which every RBAC copy is made.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import kubernetes
from kubernetes.client.exceptions import ApiException

from caramel.contract.api import GROUP, VERSION
from caramel_operator.crd import PLURAL
from caramel_operator.gang_schedulers import GroupResource

SCRAPE_TIMEOUT_SECONDS = 2.0


# The pods whose requests hold their nodes' resources, as the scheduler selects them.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class ReadForbidden(Exception):
    """The API server refused a read (RBAC); the message is its own."""


class Cluster:
    def __init__(self, *, connect_timeout_seconds: float, request_timeout_seconds: float) -> None:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        client = kubernetes.client.ApiClient()
        self.core = kubernetes.client.CoreV1Api(client)
        self.networking = kubernetes.client.NetworkingV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.apiextensions = kubernetes.client.ApiextensionsV1Api(client)
        # urllib3's (connect, read) timeouts: the read timeout bounds each wait for the server.
        self._timeout = (connect_timeout_seconds, request_timeout_seconds)

    async def _call(self, method, *args: Any, **kwargs: Any) -> Any:
        """One API call, in a worker thread, with the timeouts, its response left raw."""
        return await asyncio.to_thread(method, *args, **kwargs, _request_timeout=self._timeout, _preload_content=False)

    async def nodes_and_pods(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every node, and every pod not finished, cluster-wide: what placement reads.

        resourceVersion 0 lets the API server answer from its watch cache, as the scheduler's
        informers are fed, instead of reading etcd. Raises ReadForbidden when RBAC refuses.
        """
        try:
            nodes, pods = await asyncio.gather(
                self._call(self.core.list_node, resource_version="0"),
                self._call(self.core.list_pod_for_all_namespaces, field_selector=LIVE_PODS, resource_version="0"),
            )
        except ApiException as error:
            if error.status == 403:
                raise ReadForbidden(_message(error)) from None
            raise
        return json.loads(nodes.data)["items"], json.loads(pods.data)["items"]

    async def create_pods(self, pods: list[dict[str, Any]]) -> list[str]:
        """Create the pods; the API server's refusals, one message each."""
        results = await asyncio.gather(*(self._create(self.core.create_namespaced_pod, pod) for pod in pods))
        return [refusal for refusal in results if refusal]

    async def create_object(self, manifest: dict[str, Any]) -> list[str]:
        """Create a Service or NetworkPolicy of a job; the API server's refusal, if any."""
        create = {
            "Service": self.core.create_namespaced_service,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
        }[manifest["kind"]]
        refusal = await self._create(create, manifest)
        return [refusal] if refusal else []

    async def create_group(self, resource: GroupResource, manifest: dict[str, Any]) -> list[str]:
        """Create a gang scheduler's group object; the API server's refusal, if any."""

        def create(namespace: str, body: dict[str, Any], **options: Any) -> Any:
            return self.custom.create_namespaced_custom_object(resource.group, resource.version, namespace, resource.plural, body, **options)

        refusal = await self._create(create, manifest)
        return [refusal] if refusal else []

    async def group(self, resource: GroupResource, namespace: str, name: str) -> dict[str, Any] | None:
        """A gang scheduler's group object, or None where there is none."""
        try:
            response = await self._call(self.custom.get_namespaced_custom_object, resource.group, resource.version, namespace, resource.plural, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return json.loads(response.data)

    async def serves(self, resource: GroupResource) -> bool:
        """Whether the API server serves the resource (its discovery lists it): whether its CRD is installed."""
        try:
            response = await self._call(self.custom.get_api_resources, resource.group, resource.version)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return any(item.get("name") == resource.plural for item in json.loads(response.data).get("resources") or [])

    async def delete_group(self, resource: GroupResource, namespace: str, name: str) -> None:
        await self._delete(self.custom.delete_namespaced_custom_object, resource.group, resource.version, namespace, resource.plural, name)

    async def job_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the job now in the API, or None if it is gone (its CRD too, perhaps)."""
        job = await self._job(namespace, name)
        return None if job is None else job["metadata"].get("uid")

    async def _job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job now in the API, or None if it is gone."""
        try:
            response = await self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return json.loads(response.data)

    async def jobs(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """Every job in `namespaces` (all when empty); none when the CRD is gone."""
        if namespaces:
            lists = [self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL) for namespace in namespaces]
        else:
            lists = [self._call(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)]
        try:
            responses = await asyncio.gather(*lists)
        except ApiException as error:
            if error.status == 404:  # the CRD, and with it every job, is gone
                return []
            raise
        return [job for response in responses for job in json.loads(response.data)["items"]]

    async def write_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` into the job's (absent fields stay, null ones go); nothing if the job is gone."""
        try:
            await self._call(
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status != 404:  # gone: its reconciling task is being stopped
                raise

    async def crd_uid(self, name: str) -> str | None:
        """The uid of the CRD `name`, or None if there is none. Listed, not read: kopf's rights on
        CRDs, which the operator has, are list and watch."""
        response = await self._call(self.apiextensions.list_custom_resource_definition, field_selector=f"metadata.name={name}")
        uids = [crd["metadata"]["uid"] for crd in json.loads(response.data)["items"] if crd["metadata"]["name"] == name]
        return uids[0] if uids else None

    async def release_job(self, job: dict[str, Any], finalizer: str) -> bool:
        """Remove `finalizer` from the job, so that it can go when no handler of its runs again (its
        CRD is being deleted); True if this call removed it. A job changed since it was read (409:
        its reconciling wrote to it meanwhile) is read again and released then."""
        current: dict[str, Any] | None = job
        while current is not None and finalizer in (current["metadata"].get("finalizers") or []):
            metadata = current["metadata"]
            remaining = [f for f in metadata["finalizers"] if f != finalizer]
            body = {"metadata": {"finalizers": remaining, "resourceVersion": metadata.get("resourceVersion")}}
            try:
                await self._call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, metadata["namespace"], PLURAL, metadata["name"], body)
                return True
            except ApiException as error:
                if error.status == 404:
                    return False
                if error.status != 409:
                    raise
            current = await self._job(metadata["namespace"], metadata["name"])
        return False

    async def delete_pods(self, namespace: str, names: list[str], force: bool = False) -> None:
        grace = 0 if force else None
        await asyncio.gather(
            *(self._delete(self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace) for name in names)
        )

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._delete(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    async def _create(self, create, manifest: dict[str, Any]) -> str | None:
        try:
            await self._call(create, manifest["metadata"]["namespace"], manifest)
        except ApiException as error:
            if error.status == 409:  # already there: an earlier pass or operator created it
                return None
            if error.status is None or error.status >= 500:
                raise  # the API server's trouble, not a refusal: kopf retries the pass
            return f"{manifest['kind']} {manifest['metadata']['name']}: {_message(error)}"
        return None

    async def _delete(self, delete, *args: Any, **kwargs: Any) -> None:
        try:
            await self._call(delete, *args, **kwargs)
        except ApiException as error:
            if error.status != 404:  # already gone
                raise


def _message(error: ApiException) -> str:
    """The Status message the API server sent, which says why (e.g. which Pod Security rule)."""
    try:
        return json.loads(error.body or "")["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


async def scrape(address: str, port: int) -> str | None:
    """The /metrics text of a worker, or None if it does not answer (yet, or any more)."""
    url = f"http://{address}:{port}/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)) as session:
            async with session.get(url) as response:
                return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
