"""The key-value store Horovod's collectives meet at, in the layout of Horovod's HTTP rendezvous.

On the horovod backend, Horovod's Gloo finds the other ranks through an HTTP key-value store at
HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT (Horovod 0.28.1's `HTTPStore`): each rank PUTs its address
under `/<scope>/<rank>`, GETs the others' (a 404 until they are there: it asks again), and once
connected DELETEs its own key. Its scopes are `global` (every rank), `local_<host>` (the ranks of
one host, by HOROVOD_HOSTNAME) and `cross_<local rank>` (the ranks of that local rank on every
host). Caramel's rendezvous serves this store itself, one per round, so that the worker
entrypoint neither imports Horovod nor starts Horovod's server.

It answers as Horovod's own server does (`horovod.runner.http.http_server.RendezvousHandler`): a
scope whose every member has deleted its key is cleared, so that a second rendezvous of the same
ranks (`hvd.shutdown()`, then `hvd.init()`) finds none of the first one's keys. (Horovod's server
clears every scope's record of who finished at that point; this store keeps each scope's own.)
A DELETE in a scope the round does not size removes that one key.

One difference: a GET of a key of the round's scopes that is not there yet is held until it is
(`wait_for`), where Horovod's server answers 404 at once. Horovod's `HTTPStore::wait` gives up
once HOROVOD_GLOO_TIMEOUT_SECONDS have passed since it began asking, and that timeout is also
every collective's wait for a peer, which an elastic gang keeps short (5 s) to see a lost peer
soon. Held, the ranks of a round wait for each other to connect as long as the gang's workers
wait for each other, however long a loaded machine takes to bring them there, while Gloo's
collectives keep the short timeout.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

CHECK_SECONDS = 0.25
"""How often a held GET looks whether to give up."""


def scope_sizes(hosts: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The members of each of Horovod's scopes among `hosts` (name, slots), in Horovod's naming."""
    sizes = {"global": sum(slots for _, slots in hosts)}
    for name, slots in hosts:
        sizes[f"local_{name}"] = slots
        for local_rank in range(slots):
            sizes[f"cross_{local_rank}"] = sizes.get(f"cross_{local_rank}", 0) + 1
    return sizes


class GlooStore:
    """One round's store: values by scope and key, and who of each scope is done with it."""

    def __init__(self, hosts: Sequence[tuple[str, int]]) -> None:
        self._sizes = scope_sizes(hosts)
        self._lock = threading.Condition()
        self._values: dict[str, dict[str, bytes]] = defaultdict(dict)
        self._finished: dict[str, set[str]] = defaultdict(set)

    def wait_for(self, scope: str, key: str, seconds: float, given_up: Callable[[], bool]) -> bytes | None:
        """The value of `key`, waiting for it up to `seconds` where `scope` is one of the round's,
        unless `given_up()` (the round broke, or the server stops); None where it did not come."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while (value := self._values.get(scope, {}).get(key)) is None and scope in self._sizes:
                left = deadline - time.monotonic()
                if left <= 0 or given_up():
                    break
                self._lock.wait(min(left, CHECK_SECONDS))
            return value

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._lock:
            self._values[scope][key] = value
            self._lock.notify_all()

    def delete(self, scope: str, key: str) -> None:
        """Horovod's DELETE: rank `key` is done with `scope`; the last of its members clears it."""
        with self._lock:
            if scope not in self._sizes:
                self._values.get(scope, {}).pop(key, None)
                return
            self._finished[scope].add(key)
            if len(self._finished[scope]) >= self._sizes[scope]:
                self._values.pop(scope, None)
                self._finished.pop(scope, None)
