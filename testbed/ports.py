"""Free local TCP ports for the servers a test starts.

A port found free is not yet bound: until the test's job binds it, anything else may take it.
Three rules keep the ports a test picks from being taken:
- They are drawn from below the kernel's ephemeral range: a port the kernel may hand to any
  outgoing connection (Gloo's, Horovod's, a scrape's) was taken between the pick and the bind,
  which made the transport tests fail at random.
- Each pytest-xdist worker draws from a range of its own (PYTEST_XDIST_WORKER of
  PYTEST_XDIST_WORKER_COUNT), so that two tests running side by side never pick the same port.
  The draw uses the system's randomness, not the `random` module's: tests seed that one
  (TensorFlow's `set_random_seed` does), after which two workers drew the same ports and one job's
  workers joined the other's rendezvous.
- A process never hands out a port twice until its range is used up: the blocks a job picks one
  after another (rendezvous, metrics, transport) do not overlap, though none is bound yet.
"""

from __future__ import annotations

import os
import random
import re
import socket
from pathlib import Path

_LOWEST = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RANDOM = random.SystemRandom()
_handed_out: set[int] = set()


def free_port() -> int:
    return free_port_block(1)


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports, from this process's range (`port_range`),
    none of them handed out before by this process."""
    lowest, end = port_range()
    highest = end - count
    if highest < lowest:
        raise RuntimeError(f"no block of {count} ports fits between {lowest} and {end}")
    for attempt in range(400):
        if attempt == 200:  # the range is used up: ports handed out long ago are free again
            _handed_out.clear()
        first = _RANDOM.randint(lowest, highest)
        block = range(first, first + count)
        if not _handed_out.intersection(block) and all(_is_free(port) for port in block):
            _handed_out.update(block)
            return first
    raise RuntimeError(f"no block of {count} free ports between {lowest} and {end}")


def port_range() -> tuple[int, int]:
    """The ports this process draws from, [first, end): below the ephemeral range, and the
    pytest-xdist worker's own share of it."""
    lowest, end = _LOWEST, _first_ephemeral_port()
    worker = re.fullmatch(r"gw([0-9]+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or workers < 2:
        return lowest, end
    share = (end - lowest) // workers
    first = lowest + share * int(worker.group(1))
    return first, first + share


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
