"""`python -m caramel_operator.uninstall`: the chart's pre-delete hook, which deletes every
CaramelJob the operator serves and waits until they are gone, so that `helm uninstall` leaves no
job (and no pod: the garbage collector deletes a job's pods with it) behind.

Without it the operator went with its release while jobs still carried its finalizer, which
nothing then removed: the jobs stayed, and with `crds.keep=false` the CRD stayed Terminating
(helm's `--wait` timed out after 5 minutes). The hook runs before helm deletes anything, so the
operator still runs and removes its finalizer from each job as it goes; where it does not within
OPERATOR_PATIENCE_SECONDS (it is scaled down, or failing), the hook removes the finalizer itself.
It runs with the operator's ServiceAccount, whose rights on CaramelJobs (list, delete, patch) are
the operator's own (`caramel_operator.rbac`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from caramel_operator.cluster import Cluster
from caramel_operator.config import OperatorSettings, SettingsError
from caramel_operator.handlers import FINALIZER

# How long the operator has to release the jobs it was asked to delete before the hook does.
OPERATOR_PATIENCE_SECONDS = 60.0
# How long the hook waits in all; the chart's hook Job is given this much, within helm's default
# --timeout of 5 minutes.
WAIT_SECONDS = 240.0
LOOK_EVERY_SECONDS = 2.0
SAY_EVERY_SECONDS = 10.0


def _names(jobs: list[dict]) -> str:
    return ", ".join(f"{job['metadata']['namespace']}/{job['metadata']['name']}" for job in jobs)


async def delete_jobs(
    cluster: Cluster,
    namespaces: tuple[str, ...],
    say: Callable[[str], None],
    patience_seconds: float = OPERATOR_PATIENCE_SECONDS,
    wait_seconds: float = WAIT_SECONDS,
) -> bool:
    """Delete every job in `namespaces` (all where empty) and wait until they are gone, releasing
    the operator's finalizer from those it leaves past `patience_seconds`; whether all went
    within `wait_seconds`."""
    jobs = await cluster.jobs(namespaces)
    if not jobs:
        say("no CaramelJobs to delete")
        return True
    say(f"deleting {len(jobs)} CaramelJob(s): {_names(jobs)}")
    for job in jobs:
        await cluster.delete_job(job["metadata"]["namespace"], job["metadata"]["name"])
    started = said = time.monotonic()
    released = False
    while jobs := await cluster.jobs(namespaces):
        waited = time.monotonic() - started
        if waited >= wait_seconds:
            say(f"gave up after {waited:.0f} s: {len(jobs)} CaramelJob(s) still there: {_names(jobs)}")
            return False
        if not released and waited >= patience_seconds:
            kept = [job for job in jobs if FINALIZER in (job["metadata"].get("finalizers") or [])]
            say(f"the operator released no finalizer of {len(kept)} job(s) in {waited:.0f} s: removing {FINALIZER} from {_names(kept)}")
            for job in kept:
                await cluster.release_job(job, FINALIZER)
            released = True
        elif time.monotonic() - said >= SAY_EVERY_SECONDS:
            say(f"waiting for {len(jobs)} CaramelJob(s) to go ({waited:.0f} s): {_names(jobs)}")
            said = time.monotonic()
        await asyncio.sleep(LOOK_EVERY_SECONDS)
    say(f"every CaramelJob is gone ({time.monotonic() - started:.0f} s)")
    return True


def main() -> int:
    def say(message: str) -> None:
        print(f"caramel-uninstall: {message}", file=sys.stderr, flush=True)

    try:
        settings = OperatorSettings.from_env()
    except SettingsError as error:
        say(str(error))
        return 2
    cluster = Cluster(
        connect_timeout_seconds=settings.api_connect_timeout_seconds, request_timeout_seconds=settings.api_request_timeout_seconds
    )
    return 0 if asyncio.run(delete_jobs(cluster, settings.watch_namespaces, say)) else 1


if __name__ == "__main__":
    sys.exit(main())
