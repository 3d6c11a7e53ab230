"""The operator's writes to the Kubernetes API, and its scrapes of workers' metrics.

The kubernetes client is synchronous: every call runs in a worker thread so that kopf's event
loop keeps serving other jobs. Responses are not deserialized (`_preload_content=False`): the
operator needs none of them, and skipping it saves time at hundreds of pods. Creations that find the object already there and deletions that
find it gone count as done, which makes every action safe to repeat after an operator restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kubernetes
from kubernetes.client.exceptions import ApiException

from caramel.job.api import GROUP, VERSION
from caramel_operator.crd import PLURAL

SCRAPE_TIMEOUT_SECONDS = 2.0


class Cluster:
    def __init__(self) -> None:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        client = kubernetes.client.ApiClient()
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    async def create_pods(self, pods: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(self._create(self.core.create_namespaced_pod, pod) for pod in pods))

    async def create_service(self, service: dict[str, Any]) -> None:
        await self._create(self.core.create_namespaced_service, service)

    async def delete_pods(self, namespace: str, names: list[str], force: bool = False) -> None:
        grace = 0 if force else None
        await asyncio.gather(
            *(self._delete(self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace) for name in names)
        )

    async def delete_service(self, namespace: str, name: str) -> None:
        await self._delete(self.core.delete_namespaced_service, name, namespace)

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._delete(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    async def _create(self, create, manifest: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(create, manifest["metadata"]["namespace"], manifest, _preload_content=False)
        except ApiException as error:
            if error.status != 409:  # already there: an earlier pass or operator created it
                raise

    async def _delete(self, delete, *args: Any, **kwargs: Any) -> None:
        try:
            await asyncio.to_thread(delete, *args, **kwargs, _preload_content=False)
        except ApiException as error:
            if error.status != 404:  # already gone
                raise


async def scrape(address: str, port: int) -> str | None:
    """The /metrics text of a worker, or None if it does not answer (yet, or any more)."""
    url = f"http://{address}:{port}/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)) as session:
            async with session.get(url) as response:
                return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
