"""`python -m caramel_operator`: run the operator (settings from CARAMEL_* variables, see config.py)."""

from __future__ import annotations

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
    kopf.run(
        # One operator replica: no peering objects, and no RBAC for them.
        standalone=True,
        clusterwide=not settings.watch_namespaces,
        namespaces=settings.watch_namespaces,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
