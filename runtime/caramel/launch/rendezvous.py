"""Horovod's Gloo rendezvous: served by worker 0 on a fixed port, awaited by the others.

Workers meet here instead of being launched over ssh. Horovod's own RendezvousServer picks a
random port; a gang whose addresses are fixed in advance needs the port from the job spec, so
the HTTP server is built directly from Horovod's handler and server classes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer


class RendezvousServer:
    """The rendezvous of one job, listening on every interface of worker 0."""

    def __init__(self, port: int, hosts: str, world_size: int) -> None:
        self._httpd = RendezvousHTTPServer(("", port), RendezvousHandler, False)
        self._httpd.init(get_host_assignments(parse_hosts(hosts), world_size))
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rendezvous", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def wait_for_rendezvous(
    address: str,
    port: int,
    timeout_seconds: float,
    stop: threading.Event,
    on_wait: Callable[[float], None] = lambda waited: None,
) -> bool:
    """Block until the rendezvous accepts connections (True) or `stop` is set (False); on_wait
    reports progress at once and then about every 10 s. Raises TimeoutError after `timeout_seconds`."""
    started = time.monotonic()
    next_report = started
    while not stop.is_set():
        try:
            with socket.create_connection((address, port), timeout=2):
                return True
        except OSError as error:
            now = time.monotonic()
            if now - started > timeout_seconds:
                raise TimeoutError(
                    f"timed out after {timeout_seconds:.0f} s waiting for the rendezvous at {address}:{port}: {error}"
                ) from None
            if now >= next_report:
                on_wait(now - started)
                next_report = now + 10
            stop.wait(0.25)
    return False
