"""Free local TCP ports for the servers a test starts.

The ports are drawn from below the kernel's ephemeral range: a port the kernel may hand to any
outgoing connection (Gloo's, Horovod's, a scrape's) can be taken between the moment a test picks
it and the moment a worker listens on it, which made the transport tests fail at random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    return free_port_block(1)


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports, all below the ephemeral range."""
    highest = _first_ephemeral_port() - count
    for _ in range(200):
        first = random.randint(_LOWEST, highest)
        if all(_is_free(first + offset) for offset in range(count)):
            return first
    raise RuntimeError(f"no block of {count} free ports between {_LOWEST} and {highest + count}")


def _first_ephemeral_port() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default when the range cannot be read


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
        return True
