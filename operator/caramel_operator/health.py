"""The operator's health: whether its watch delivers the CaramelJobs the API server holds.

kopf reconnects a watch stream that has been silent for 70 s, but a watch can stall in ways it
does not notice (kopf#1276). And when the CaramelJob CRD is deleted and created again, kopf may
stop watching CaramelJobs until it restarts: it reads the API's discovery again at each event of
the CRD, and the API server can publish the re-created resource there only after the CRD's last
event (seen on Kubernetes v1.36, where a new job got no status for as long as the operator ran).
Either way jobs go unserved, and nothing says so.

So the probes compare the jobs the API server lists with the versions of them the watch has
delivered. A job whose listed version the watch has not delivered, while it delivered nothing
newer of that job either, for longer than CARAMEL_WATCH_STALL_SECONDS fails liveness, and the
kubelet restarts the operator, which lists and watches afresh. Readiness: the operator has caught
up with the API server once (its initial listing is done) and still reaches it.

Jobs are told apart by uid, not by namespace and name: a job deleted with its CRD goes without
its deletion ever being delivered (kopf stops watching a resource whose CRD is terminating: the
API server no longer lets it be patched), and a job later created under the same name is another
job. Keyed by name, the deleted job's version stood for the new job's, which the watch then
seemed never to deliver: on v1.36 /healthz reported it ever further behind until the kubelet
restarted the operator. A job's entry goes with the deletion the watch delivers, and every entry
with the CRD (whose deletion the API server completes only once every job is gone).

The readiness endpoint shares the metrics port: kopf serves the liveness endpoint, on a port of
its own, and only its probe handlers' results.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp.web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

READINESS_PATH = "/readyz"
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class Listed:
    """A job as the API server lists it."""

    job: str
    """ "namespace/name", for people."""

    version: str
    """Its resourceVersion."""


@dataclass(frozen=True)
class Lag:
    job: str
    """The job ("namespace/name") whose change has waited longest for the watch; empty for none."""

    seconds: float
    """How long it has waited, as far as the looks so far can tell."""


class WatchCheck:
    """What the watch delivered of each job, and successive looks at the API server's jobs
    against it. Jobs are keyed by uid."""

    def __init__(self) -> None:
        self._delivered: dict[str, str] = {}
        """The last version the watch delivered of each job it has not seen deleted."""
        # Per job behind: the version the watch had delivered, and since when it has been behind.
        self._behind: dict[str, tuple[str | None, float]] = {}
        self.caught_up = False
        """Whether one look found every job delivered: the initial listing is done."""

    def delivered(self, uid: str, version: str) -> None:
        """The watch delivered this version of a job."""
        self._delivered[uid] = version

    def deleted(self, uid: str) -> None:
        """The watch delivered a job's deletion."""
        self._delivered.pop(uid, None)

    def crd_deleted(self) -> None:
        """The CRD is gone, and every job with it: deletions the watch may never deliver."""
        self._delivered.clear()

    def look(self, listed: Mapping[str, Listed], now: float) -> Lag:
        """`listed`: every job the API server lists, by uid; `now`: a monotonic time."""
        behind: dict[str, tuple[str | None, float]] = {}
        for uid, job in listed.items():
            seen = self._delivered.get(uid)
            if seen == job.version:
                continue
            previous = self._behind.get(uid)
            # Still behind since then only if the watch has delivered nothing of the job since.
            since = previous[1] if previous is not None and previous[0] == seen else now
            behind[uid] = (seen, since)
        self._behind = behind
        if not behind:
            self.caught_up = True
            return Lag("", 0.0)
        uid, (_, since) = min(behind.items(), key=lambda item: item[1][1])
        return Lag(listed[uid].job, now - since)


async def serve(port: int, registry: CollectorRegistry, unready: Callable[[], Awaitable[str | None]]) -> aiohttp.web.AppRunner:
    """Serve the metrics and the readiness endpoint on `port`; `unready` says why the operator is
    not ready, or None when it is. Probes and scrapes are not logged: they come every few seconds."""

    async def metrics(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readiness(request: aiohttp.web.Request) -> aiohttp.web.Response:
        why = await unready()
        return aiohttp.web.Response(text=why or "ready", status=503 if why else 200)

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get(METRICS_PATH, metrics), aiohttp.web.get(READINESS_PATH, readiness)])
    runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
