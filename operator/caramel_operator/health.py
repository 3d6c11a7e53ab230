"""The operator's health: whether its watch delivers the CaramelJobs the API server holds.

kopf reconnects a watch stream that has been silent for 70 s, but a watch can stall in ways it
does not notice (kopf#1276). And when the CaramelJob CRD is deleted and created again, kopf may
stop watching CaramelJobs until it restarts: it reads the API's discovery again at each event of
the CRD, and the API server can publish the re-created resource there only after the CRD's last
event (seen on Kubernetes v1.36, where a new job got no status for as long as the operator ran).
Either way jobs go unserved, and nothing says so.

So the probes compare the jobs the API server lists with the versions of them the watch has
delivered (kopf's index of them, filled from the watch). A job whose listed version the watch has
not delivered, while it delivered nothing newer of that job either, for longer than
CARAMEL_WATCH_STALL_SECONDS fails liveness, and the kubelet restarts the operator, which lists and
watches afresh. Readiness: the operator has caught up with the API server once (its initial
listing is done) and still reaches it.

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
class Lag:
    job: str
    """The job ("namespace/name") whose change has waited longest for the watch; empty for none."""

    seconds: float
    """How long it has waited, as far as the looks so far can tell."""


class WatchCheck:
    """Successive looks at the API server's jobs against the watch's."""

    def __init__(self) -> None:
        # Per job behind: the version the watch had delivered, and since when it has been behind.
        self._behind: dict[str, tuple[str | None, float]] = {}
        self.caught_up = False
        """Whether one look found every job delivered: the initial listing is done."""

    def look(self, listed: Mapping[str, str], delivered: Mapping[str, str], now: float) -> Lag:
        """`listed`: each job's resourceVersion in the API server; `delivered`: the last one the
        watch delivered of each; `now`: a monotonic time."""
        behind: dict[str, tuple[str | None, float]] = {}
        for job, version in listed.items():
            seen = delivered.get(job)
            if seen == version:
                continue
            previous = self._behind.get(job)
            # Still behind since then only if the watch has delivered nothing of the job since.
            since = previous[1] if previous is not None and previous[0] == seen else now
            behind[job] = (seen, since)
        self._behind = behind
        if not behind:
            self.caught_up = True
            return Lag("", 0.0)
        job, (_, since) = min(behind.items(), key=lambda item: item[1][1])
        return Lag(job, now - since)


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
