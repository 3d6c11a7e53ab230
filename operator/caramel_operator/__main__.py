"""`python -m caramel_operator`: run the operator (settings from CARAMEL_* variables, see config.py)."""

from __future__ import annotations

import logging
import sys

import kopf

from caramel_operator.config import OperatorSettings, SettingsError


def main() -> int:
    try:
        settings = OperatorSettings.from_env()
    except SettingsError as error:
        print(f"caramel-operator: {error}", file=sys.stderr)
        return 2
    import caramel_operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=False)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_worth_a_line)
    # A line per request to the liveness endpoint, 6 a minute, said nothing.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    kopf.run(
        # One operator replica: no peering objects, and no RBAC for them.
        standalone=True,
        clusterwide=not settings.watch_namespaces,
        namespaces=settings.watch_namespaces,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
    )
    return 0


def _worth_a_line(record: logging.LogRecord) -> bool:
    """Leave out kopf's line for each handler run that succeeded: a reconcile pass every few
    seconds per job, each probe, each event of the CRD, which would bury the lines that matter
    and grow with the number of jobs. The operator logs each change of a job itself; failures
    are still logged."""
    return not (record.name.startswith("kopf.") and record.levelno <= logging.INFO and record.getMessage().endswith(" succeeded."))


if __name__ == "__main__":
    sys.exit(main())
