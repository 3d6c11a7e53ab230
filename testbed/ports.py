"""Free local TCP ports for the servers a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports."""
    for _ in range(100):
        first = free_port()
        if first + count < 65535 and all(_is_free(first + offset) for offset in range(count)):
            return first
    raise RuntimeError(f"no block of {count} free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
        return True
