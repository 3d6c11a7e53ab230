"""Caramel's rendezvous: where a gang's workers meet, served over HTTP by worker 0.

Workers meet in rounds. Each worker joins the open round (`PUT /caramel/join/<worker>`, with its
slots) and asks for it until it closes (`GET /caramel/round/<number>`); a closed round is its
hosts, in rank order, which every member reads alike. The round's members are decided by the
gang's rule, here the contract's: the gang is the workers CARAMEL_HOSTS names, and the round
closes once every one of them has joined, so a gang has one round and no worker starts training
before all are there. (A gang whose rounds follow the workers alive at the time, as elastic
training would need, takes another rule in `Rounds`; the protocol and the clients stay.)

Each round, once closed, also has a key-value store in the layout of Horovod's Gloo rendezvous
(`gloo_store.GlooStore`, every path that is not `/caramel/...`): on the horovod backend,
HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT lead Horovod's collectives here. Nothing of Horovod is
imported or run to serve it, so jobs run where Horovod is not installed.

Worker 0 serves on spec.rendezvous.port, on every interface, and joins its own server over the
loopback; the others join at HOROVOD_GLOO_RENDEZVOUS_ADDR, waiting for the server to answer.
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from caramel.launch.gloo_store import GlooStore

CARAMEL_PATH = "/caramel/"
JOIN = re.compile(r"/caramel/join/([^/]+)")
ROUND = re.compile(r"/caramel/round/([0-9]+)")
POLL_SECONDS = 0.25
REQUEST_TIMEOUT_SECONDS = 10
REPORT_EVERY_SECONDS = 10


@dataclass(frozen=True)
class Host:
    """A worker as the rendezvous knows it: its name (HOROVOD_HOSTNAME) and its training processes."""

    name: str
    slots: int


def parse_hosts(text: str) -> tuple[Host, ...]:
    """The gang of CARAMEL_HOSTS (`<worker>:<slots>,...`, in worker order)."""
    hosts = []
    for entry in text.split(","):
        name, _, slots = entry.rpartition(":")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise RuntimeError(f"CARAMEL_HOSTS is {text!r}: expected <worker>:<slots>,... with slots of at least 1")
        hosts.append(Host(name, int(slots)))
    return tuple(hosts)


@dataclass(frozen=True)
class Round:
    """A closed round: its number and its hosts, in rank order."""

    number: int
    hosts: tuple[Host, ...]

    @property
    def world_size(self) -> int:
        return sum(host.slots for host in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"round": self.number, "hosts": [[host.name, host.slots] for host in self.hosts]}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Round:
        return cls(int(document["round"]), tuple(Host(str(name), int(slots)) for name, slots in document["hosts"]))


class Refused(Exception):
    """A join the gang's rule refuses; the message says why."""


class Rounds:
    """The rounds of one gang: who has joined the open one, and the rounds closed, each with the
    store Horovod's collectives meet at."""

    def __init__(self, gang: Sequence[Host]) -> None:
        self.gang = tuple(gang)
        self._lock = threading.Lock()
        self._joined: dict[str, Host] = {}
        self._closed: list[Round] = []
        self.store: GlooStore | None = None
        """The store of the last round closed (None before the first closes)."""

    def join(self, host: Host) -> int:
        """Add `host` to the open round; the number of the round it is in. A member of a closed
        round who joins again (a retried request) is told that round."""
        with self._lock:
            self._check_member(host)
            if self._closed:
                return self._closed[-1].number
            self._joined[host.name] = host
            if len(self._joined) == len(self.gang):
                self._close()
            return len(self._closed) - 1 if self._closed else 0

    def status(self, number: int) -> Round | list[Host]:
        """Round `number` once closed; while it is open, the workers it still waits for."""
        with self._lock:
            if number < len(self._closed):
                return self._closed[number]
            if number > len(self._closed):
                raise Refused(f"there is no round {number} yet (rounds so far: {len(self._closed)})")
            return [host for host in self.gang if host.name not in self._joined]

    def _check_member(self, host: Host) -> None:
        """The contract's rule: only the gang's workers, each with its slots."""
        member = next((known for known in self.gang if known.name == host.name), None)
        if member is None:
            raise Refused(f"{host.name} is not a worker of this gang ({', '.join(known.name for known in self.gang)})")
        if member.slots != host.slots:
            raise Refused(f"{host.name} runs {host.slots} training processes; the gang gives it {member.slots}")

    def _close(self) -> None:
        """Close the open round: the gang's hosts in their order, with a fresh store."""
        closed = Round(len(self._closed), self.gang)
        self.store = GlooStore([(host.name, host.slots) for host in closed.hosts])
        self._closed.append(closed)
        self._joined = {}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_PUT(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        joined = JOIN.fullmatch(self.path)
        if joined:
            try:
                slots = json.loads(body)["slots"]
                self._answer(200, {"round": self.server.rounds.join(Host(joined.group(1), int(slots)))})
            except Refused as refused:
                self._answer(409, {"error": str(refused)})
            except (ValueError, KeyError, TypeError):
                self._answer(400, {"error": 'a join carries {"slots": N}'})
            return
        scope_key = self._scope_key()
        if scope_key:
            store = self._store()
            if store:
                store.put(*scope_key, body)
                self._answer(200, None)

    def do_GET(self) -> None:  # noqa: N802
        asked = ROUND.fullmatch(self.path)
        if asked:
            try:
                status = self.server.rounds.status(int(asked.group(1)))
            except Refused as refused:
                self._answer(404, {"error": str(refused)})
                return
            if isinstance(status, Round):
                self._answer(200, status.to_json())
            else:
                self._answer(200, {"round": int(asked.group(1)), "waiting_for": [host.name for host in status]})
            return
        scope_key = self._scope_key()
        if scope_key:
            store = self._store()
            value = store.get(*scope_key) if store else None
            if store and value is None:
                self._answer(404, None)
            elif value is not None:
                self._answer(200, value)

    def do_DELETE(self) -> None:  # noqa: N802
        scope_key = self._scope_key()
        if scope_key:
            store = self._store()
            if store:
                store.delete(*scope_key)
                self._answer(200, None)

    def _scope_key(self) -> tuple[str, str] | None:
        """Horovod's `/<scope>/<key>`; anything else is answered 400 here."""
        parts = self.path.split("/")
        if self.path.startswith(CARAMEL_PATH) or len(parts) != 3 or not all(parts[1:]):
            self._answer(400, {"error": f"no such path: {self.path}"})
            return None
        return parts[1], parts[2]

    def _store(self) -> GlooStore | None:
        """The last closed round's store; before any round closed, a 409 (Horovod asks again)."""
        store = self.server.rounds.store
        if store is None:
            self._answer(409, {"error": "no round has closed yet"})
        return store

    def _answer(self, status: int, body: bytes | dict[str, Any] | None) -> None:
        data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        """Quiet: Horovod's ranks ask many times while they wait for each other."""


class _Server(http.server.ThreadingHTTPServer):
    # As the metrics servers do: connections of an earlier run lingering in TIME_WAIT must not
    # keep a restarted gang's worker 0 from binding the port.
    allow_reuse_address = True

    def __init__(self, port: int, rounds: Rounds) -> None:
        super().__init__(("", port), _Handler)
        self.rounds = rounds


class RendezvousServer:
    """The rendezvous of one gang, listening on every interface of worker 0."""

    def __init__(self, port: int, gang: Sequence[Host]) -> None:
        self.rounds = Rounds(gang)
        self._httpd = _Server(port, self.rounds)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rendezvous", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def join_round(
    address: str,
    port: int,
    host: Host,
    timeout_seconds: float,
    stop: threading.Event,
    on_wait: Callable[[str], None] = lambda text: None,
) -> Round | None:
    """Join the open round at the rendezvous and return it once closed, or None if `stop` is set
    first. While waiting, `on_wait` hears what for, at once and then about every 10 s. Raises
    TimeoutError after `timeout_seconds`, and RuntimeError where the rendezvous refuses `host`."""
    started = time.monotonic()
    next_report = started
    number: int | None = None
    while not stop.is_set():
        waited = time.monotonic() - started
        try:
            if number is None:
                number = int(_request(address, port, "PUT", f"/caramel/join/{host.name}", {"slots": host.slots})["round"])
            status = _request(address, port, "GET", f"/caramel/round/{number}")
        except OSError as error:
            waiting = f"the rendezvous at {address}:{port}"
            reason = str(error)
        else:
            if "hosts" in status:
                return Round.from_json(status)
            missing = status["waiting_for"]
            waiting = f"{', '.join(missing)} to join round {number} at the rendezvous at {address}:{port}"
            reason = f"{len(missing)} worker(s) never joined: {', '.join(missing)}"
        if waited > timeout_seconds:
            raise TimeoutError(f"timed out after {timeout_seconds:.0f} s waiting for the rendezvous at {address}:{port}: {reason}")
        if time.monotonic() >= next_report:
            on_wait(f"waiting for {waiting} ({waited:.0f} s)")
            next_report = time.monotonic() + REPORT_EVERY_SECONDS
        stop.wait(POLL_SECONDS)
    return None


def _request(address: str, port: int, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to the rendezvous and its JSON answer. Connection failures are OSErrors (the
    server is not up yet); a refusal is a RuntimeError with the server's reason."""
    connection = http.client.HTTPConnection(address, port, timeout=REQUEST_TIMEOUT_SECONDS)
    try:
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None)
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
    except (http.client.HTTPException, json.JSONDecodeError) as error:
        raise ConnectionError(f"no rendezvous answer at {address}:{port}: {error}") from error
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"the rendezvous at {address}:{port} refused {method} {path}: {answer.get('error', response.status)}")
    return answer
