"""A Kubernetes API emulator on a local port: kmock's KubernetesEmulator, serving the CaramelJob resource.

Run as `python -m testbed.kube_emulator URL_FILE`; it writes its base URL to URL_FILE and serves
until SIGTERM. It stands in for kube-apiserver, which cannot run on these machines: it keeps
objects and serves real HTTP lists, watches, patches and deletes, but has no scheduler, kubelet,
garbage collector or label selectors. Tests play the kubelet by patching pod status.
"""

import asyncio
import datetime
import secrets
import signal
import sys
import uuid
from pathlib import Path

import attrs
import kmock

from caramel_operator.crd import SHORT_NAMES


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus what kube-apiserver fills in on every create.

    Names from metadata.generateName (kopf names its Events that way), a uid (owner references
    need it), a resourceVersion (kopf's JSON patches test it) and a creation time.
    """

    async def _handle(self, request: kmock.Request):
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = metadata["generateName"] + secrets.token_hex(3)
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("resourceVersion", "1")
            metadata.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return await super()._handle(request)


async def serve(url_file: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with ApiServerEmulator() as emulator:
        emulator.resources.load_bundled()
        emulator.resources["caramel.dev/v1alpha1/carameljobs"] = kmock.ResourceInfo(
            kind="CaramelJob",
            singular="carameljob",
            namespaced=True,
            shortnames=set(SHORT_NAMES),
            subresources={"status"},
            verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
        )
        async with kmock.Server(emulator) as server:
            url_file.write_text(str(server.url).rstrip("/"))
            await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
