"""Caramel's rendezvous: where a gang's workers meet, served over HTTP by worker 0.

Workers meet in rounds. Each worker joins the open round (`PUT /caramel/join/<worker>`, with its
slots, the round it knows last and who it is: one worker's processes share one `member` id) and
asks for it until it closes (`GET /caramel/round/<number>`); a closed round is its hosts, in the
gang's worker order (worker 0, which serves here, is rank 0), which every member reads alike. The
first round closes once every worker CARAMEL_HOSTS names has joined, so no worker starts training
before all are there. A gang that may run short (CARAMEL_MIN_WORKERS below its workers) meets
again while it trains, when an elastic script re-forms its ranks (Horovod's `hvd.elastic`): a
later round's members are the workers alive, and it closes once every member of the round before
has joined again (a worker that came back joins it too), or, where some never come (lost), once
no one has joined for SETTLE_SECONDS, at least the fewest workers, worker 0 among them, are in,
and every member missing is gone: rank 0 is always worker 0, whose state the others take (a
worker that came back has none to give), and whose loss restarts the whole gang. A member is gone
once its worker says so or stops saying it is alive (`PUT /caramel/alive/<worker>`, `"alive":
true` every BEAT_SECONDS while its training processes run, `false` when they end: `Beats`); a
survivor whose worker is alive is waited for, however long its failing collective and its
clean-up take, up to SURVIVOR_PATIENCE_SECONDS. A worker that joins while the others train waits in the open
round: they see it there (`check_host_updates`) and join it.

Each round, once closed, also has a key-value store in the layout of Horovod's Gloo rendezvous
(`gloo_store.GlooStore`, every path that is not `/caramel/...`): on the horovod backend,
HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT lead Horovod's collectives here. Nothing of Horovod is
imported or run to serve it, so jobs run where Horovod is not installed.

Worker 0 serves on spec.rendezvous.port, on every interface, and joins its own server over the
loopback; the others join at HOROVOD_GLOO_RENDEZVOUS_ADDR, waiting for the server to answer.
"""

from __future__ import annotations

import functools
import http.client
import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, ROUND_WORKERS_VARIABLE
from caramel.launch.gloo_store import GlooStore

CARAMEL_PATH = "/caramel/"
JOIN = re.compile(r"/caramel/join/([^/]+)")
ALIVE = re.compile(r"/caramel/alive/([^/]+)")
ROUND = re.compile(r"/caramel/round/([0-9]+)")
ROUND_VARIABLE = "CARAMEL_ROUND"
"""The round a training process's ranks come from (set by its worker: `Round.rank_env`), or
JOIN_WHEN_READY for one of a worker that came back to an elastic gang: it joins the open round
itself once it is ready to train, so that the others do not wait for it to start."""
JOIN_WHEN_READY = "join"
MEMBER_VARIABLE = "CARAMEL_MEMBER"
"""Who a worker is at the rendezvous (one id per worker process, shared by its training processes):
a worker started again in a lost one's place is a new member under the same name."""
POLL_SECONDS = 0.25
STOP_POLL_SECONDS = 0.05
REQUEST_TIMEOUT_SECONDS = 10
REPORT_EVERY_SECONDS = 10
GONE = 410
"""The answer to a worker that asks to join a gang that has finished."""
# How long a later round of an elastic gang waits for more of the round before's members after the
# last join: survivors of a lost worker see their collective fail within milliseconds of each
# other, while a survivor in the middle of a step's computation joins once its next collective fails.
SETTLE_SECONDS = 3.0
# A worker of an elastic gang says it is alive this often while its training processes run; one
# not heard from for LEASE_SECONDS is gone (its pod was lost, with no word).
BEAT_SECONDS = 1.0
LEASE_SECONDS = 3 * BEAT_SECONDS
# How long a later round waits for a survivor whose worker is alive: its collective fails within
# the Gloo peer timeout, and what it does before it joins can take seconds more on a loaded
# machine (benchmarks/results/2026-11-29-keras-elastic-reform-time.txt). One stuck past this is
# left out; it joins the round after, and the others take it in at their next commit.
SURVIVOR_PATIENCE_SECONDS = 60.0


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

    def rank_env(self, host_name: str, slot: int) -> dict[str, str]:
        """The ranks of training process `slot` of `host_name` in this round, as Horovod reads them,
        and the round and its workers, for the contract and the next join."""
        names = [host.name for host in self.hosts]
        if host_name not in names:
            raise RuntimeError(f"{host_name} is not in round {self.number} ({', '.join(names)})")
        index = names.index(host_name)
        first = sum(host.slots for host in self.hosts[:index])
        return {
            "HOROVOD_RANK": str(first + slot),
            "HOROVOD_SIZE": str(self.world_size),
            "HOROVOD_CROSS_RANK": str(index),
            "HOROVOD_CROSS_SIZE": str(len(self.hosts)),
            ROUND_VARIABLE: str(self.number),
            # Which workers the ranks are: the contract's topology and addresses follow them.
            ROUND_WORKERS_VARIABLE: ",".join(names),
        }

    def to_json(self) -> dict[str, Any]:
        return {"round": self.number, "hosts": [[host.name, host.slots] for host in self.hosts]}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Round:
        return cls(int(document["round"]), tuple(Host(str(name), int(slots)) for name, slots in document["hosts"]))


class Refused(Exception):
    """A join the gang's rule refuses; the message says why."""


class GangFinished(Exception):
    """The gang finished training while a worker waited to rejoin it: that worker has nothing to do."""


@dataclass(frozen=True)
class OpenRound:
    """The open round: who has joined it, and whom of the round before it still waits for."""

    number: int
    joined: tuple[str, ...]
    waiting_for: tuple[str, ...]


class Rounds:
    """The rounds of one gang: who has joined the open one, and the rounds closed, each with the
    store Horovod's collectives meet at. `min_workers` is the fewest workers a later round may close
    with (the whole gang where unset: a fixed gang has one round)."""

    def __init__(
        self,
        gang: Sequence[Host],
        min_workers: int | None = None,
        settle_seconds: float = SETTLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gang = tuple(gang)
        self.min_workers = len(self.gang) if min_workers is None else min_workers
        self.settle_seconds = settle_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._joined: dict[str, str] = {}
        """The open round's workers, by name: their member ids."""
        self._last_join = 0.0
        self._reforming_since: float | None = None
        """When the first member of the last closed round joined the open one (its ranks broke then)."""
        self._heard: dict[tuple[str, str], float] = {}
        """When each worker process (name, member) last said it is alive; gone ones are dropped."""
        self._gone: set[tuple[str, str]] = set()
        """The worker processes that said their training processes ended."""
        self._closed: list[Round] = []
        self._members: list[dict[str, str]] = []
        """Each closed round's member ids, by worker."""
        self.store: GlooStore | None = None
        """The store of the last round closed (None before the first closes)."""
        self._finished = False

    def finish(self) -> tuple[str, ...]:
        """The gang has finished training: workers waiting in the open round (a lost worker that
        came back too late) are told so. Those waiting."""
        with self._lock:
            self._finished = True
            return tuple(self._joined)

    def join(self, host: Host, member: str = "", after: int = -1) -> int:
        """Add `host` (worker process `member`) to the open round; the number of the round it is
        in. A member already in a closed round after `after` (a retried request, or another
        training process of its worker) is told that round."""
        with self._lock:
            self._check_finished()
            self._check_member(host)
            for number in range(len(self._closed) - 1, after, -1):
                if self._members[number].get(host.name) == member:
                    return number
            if self._reforming_since is None and self._closed and host.name in self._members[-1]:
                self._reforming_since = self._clock()
            self._joined[host.name] = member
            self._last_join = self._clock()
            self._close_if_due()
            return len(self._closed) - 1 if not self._joined else len(self._closed)

    def alive(self, host_name: str, member: str) -> None:
        """Worker process `member` of `host_name` says its training processes run."""
        with self._lock:
            self._check_member_name(host_name)
            self._heard[(host_name, member)] = self._clock()

    def gone(self, host_name: str, member: str) -> None:
        """Worker process `member` of `host_name` says its training processes have ended."""
        with self._lock:
            self._heard.pop((host_name, member), None)
            self._gone.add((host_name, member))
            self._close_if_due()

    def broken(self, store: GlooStore) -> bool:
        """Whether the ranks of `store`'s round will never all connect there: a later round has
        closed, or a member of it is gone (it said so, or its lease ran out)."""
        with self._lock:
            if store is not self.store:
                return True
            now = self._clock()
            return any(
                (name, member) in self._gone or now - self._heard.get((name, member), now) >= LEASE_SECONDS
                for name, member in self._members[-1].items()
            )

    def status(self, number: int) -> Round | OpenRound:
        """Round `number` once closed; while it is open, who joined it and whom it waits for."""
        with self._lock:
            self._close_if_due()
            if number < len(self._closed):
                return self._closed[number]
            self._check_finished()
            if number > len(self._closed):
                raise Refused(f"there is no round {number} yet (rounds so far: {len(self._closed)})")
            expected = self._closed[-1].hosts if self._closed else self.gang
            return OpenRound(
                number,
                tuple(name for name in (host.name for host in self.gang) if name in self._joined),
                tuple(host.name for host in expected if host.name not in self._joined),
            )

    def _check_finished(self) -> None:
        if self._finished:
            raise GangFinished("the gang has finished training")

    def _check_member(self, host: Host) -> None:
        """The contract's rule: only the gang's workers, each with its slots."""
        member = self._check_member_name(host.name)
        if member.slots != host.slots:
            raise Refused(f"{host.name} runs {host.slots} training processes; the gang gives it {member.slots}")

    def _check_member_name(self, name: str) -> Host:
        member = next((known for known in self.gang if known.name == name), None)
        if member is None:
            raise Refused(f"{name} is not a worker of this gang ({', '.join(known.name for known in self.gang)})")
        return member

    def _close_if_due(self) -> None:
        """Close the open round where the gang's rule says it is complete (see the module's docstring)."""
        if not self._joined:
            return
        if not self._closed:
            if len(self._joined) == len(self.gang):
                self._close()
            return
        missing = [host.name for host in self._closed[-1].hosts if host.name not in self._joined]
        if not missing:
            self._close()
        elif (
            self._clock() - self._last_join >= self.settle_seconds
            and len(self._joined) >= self.min_workers
            and self.gang[0].name in self._joined
            and not any(self._survivor_may_come(name) for name in missing)
        ):
            self._close()

    def _survivor_may_come(self, name: str) -> bool:
        """Whether `name`, a member of the round before that has not joined this one, may still:
        its worker process is alive (heard within LEASE_SECONDS) and the round has waited less
        than SURVIVOR_PATIENCE_SECONDS for it."""
        now = self._clock()
        heard = self._heard.get((name, self._members[-1][name]))
        waited = now - (self._reforming_since or now)
        return heard is not None and now - heard < LEASE_SECONDS and waited < SURVIVOR_PATIENCE_SECONDS

    def _close(self) -> None:
        """Close the open round: its workers in the gang's order, with a fresh store."""
        closed = Round(len(self._closed), tuple(host for host in self.gang if host.name in self._joined))
        self.store = GlooStore([(host.name, host.slots) for host in closed.hosts])
        self._closed.append(closed)
        self._members.append(self._joined)
        self._joined = {}
        self._reforming_since = None


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_PUT(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        joined = JOIN.fullmatch(self.path)
        if joined:
            try:
                asked = json.loads(body)
                host = Host(joined.group(1), int(asked["slots"]))
                self._answer(200, {"round": self.server.rounds.join(host, str(asked.get("member", "")), int(asked.get("after", -1)))})
            except Refused as refused:
                self._answer(409, {"error": str(refused)})
            except GangFinished as finished:
                self._answer(GONE, {"error": str(finished)})
            except (ValueError, KeyError, TypeError):
                self._answer(400, {"error": 'a join carries {"slots": N}'})
            return
        alive = ALIVE.fullmatch(self.path)
        if alive:
            try:
                said = json.loads(body)
                if said["alive"]:
                    self.server.rounds.alive(alive.group(1), str(said["member"]))
                else:
                    self.server.rounds.gone(alive.group(1), str(said["member"]))
                self._answer(200, None)
            except Refused as refused:
                self._answer(409, {"error": str(refused)})
            except (ValueError, KeyError, TypeError):
                self._answer(400, {"error": 'a word of life carries {"member": ID, "alive": true|false}'})
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
            except GangFinished as finished:
                self._answer(GONE, {"error": str(finished)})
                return
            if isinstance(status, Round):
                self._answer(200, status.to_json())
            else:
                self._answer(200, {"round": status.number, "joined": list(status.joined), "waiting_for": list(status.waiting_for)})
            return
        scope_key = self._scope_key()
        if scope_key:
            store = self._store()
            if store is None:
                return
            rounds, server = self.server.rounds, self.server
            value = store.wait_for(*scope_key, server.store_patience_seconds, lambda: server.stopping.is_set() or rounds.broken(store))
            if value is None:
                self._answer(404, None)
            else:
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

    def __init__(self, port: int, rounds: Rounds, store_patience_seconds: float) -> None:
        super().__init__(("", port), _Handler)
        self.rounds = rounds
        self.store_patience_seconds = store_patience_seconds
        self.stopping = threading.Event()


class RendezvousServer:
    """The rendezvous of one gang, listening on every interface of worker 0. Horovod's ranks wait
    for each other at a round's store up to `store_patience_seconds` (`gloo_store`): the contract's
    rendezvous timeout, as the workers wait for each other."""

    def __init__(
        self, port: int, gang: Sequence[Host], min_workers: int | None = None, store_patience_seconds: float = RENDEZVOUS_TIMEOUT_SECONDS
    ) -> None:
        self.rounds = Rounds(gang, min_workers)
        self._httpd = _Server(port, self.rounds, store_patience_seconds)
        # The server looks for `stop()` this often (http.server's default, 0.5 s, was up to half of
        # the 2 s a stopped worker 0 has to exit in).
        serving = functools.partial(self._httpd.serve_forever, poll_interval=STOP_POLL_SECONDS)
        self._thread = threading.Thread(target=serving, name="rendezvous", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.stopping.set()  # held GETs answer at once: closing the server waits for them
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


class Beats:
    """A worker process's word to the rendezvous of an elastic gang that its training processes
    run, so that a later round waits for them (`Rounds`): every BEAT_SECONDS from a thread, from
    `start()` until `end()`, which says they have ended. A word that finds no rendezvous is
    dropped: the ranks learn of a lost rendezvous themselves."""

    def __init__(self, address: str, port: int, host_name: str, member: str) -> None:
        self._say = functools.partial(_tell, address, port, f"/caramel/alive/{host_name}", member)
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rendezvous-beats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def end(self) -> None:
        """Say the training processes have ended (at once: a round then need not wait for them)."""
        if not self._ended.is_set():
            self._ended.set()
            self._thread.join()
            self._say(alive=False)

    def _beat(self) -> None:
        while not self._ended.is_set():
            self._say(alive=True)
            self._ended.wait(BEAT_SECONDS)


def _tell(address: str, port: int, path: str, member: str, alive: bool) -> None:
    try:
        # A word that takes longer than a beat is dropped: the next one says the same.
        _request(address, port, "PUT", path, {"member": member, "alive": alive}, timeout_seconds=BEAT_SECONDS)
    except (OSError, RuntimeError):
        pass


class _Patience:
    """One wait at the rendezvous: its timeout, and what it tells while it lasts (at once, then
    about every 10 s)."""

    def __init__(self, address: str, port: int, timeout_seconds: float, on_wait: Callable[[str], None]) -> None:
        self.address, self.port, self.timeout_seconds, self.on_wait = address, port, timeout_seconds, on_wait
        self.started = self.next_report = time.monotonic()

    def waited(self, waiting: str, reason: str) -> None:
        """Another look found nothing yet: raise TimeoutError past the timeout, or say what for."""
        waited = time.monotonic() - self.started
        if waited > self.timeout_seconds:
            raise TimeoutError(
                f"timed out after {self.timeout_seconds:.0f} s waiting for the rendezvous at {self.address}:{self.port}: {reason}"
            )
        if time.monotonic() >= self.next_report:
            self.on_wait(f"waiting for {waiting} ({waited:.0f} s)")
            self.next_report = time.monotonic() + REPORT_EVERY_SECONDS


def join_round(
    address: str,
    port: int,
    host: Host,
    timeout_seconds: float,
    stop: threading.Event,
    on_wait: Callable[[str], None] = lambda text: None,
    member: str = "",
    after: int = -1,
) -> Round | None:
    """Join the open round at the rendezvous as worker process `member` (a round after `after`,
    the last one it knew) and return it once closed, or None if `stop` is set first. While
    waiting, `on_wait` hears what for, at once and then about every 10 s. Raises TimeoutError
    after `timeout_seconds`, RuntimeError where the rendezvous refuses `host`, and GangFinished
    where the gang finished training meanwhile."""
    patience = _Patience(address, port, timeout_seconds, on_wait)
    number: int | None = None
    while not stop.is_set():
        try:
            if number is None:
                joining = {"slots": host.slots, "member": member, "after": after}
                number = int(_request(address, port, "PUT", f"/caramel/join/{host.name}", joining)["round"])
            status = _request(address, port, "GET", f"/caramel/round/{number}")
        except OSError as error:
            patience.waited(f"the rendezvous at {address}:{port}", str(error))
        else:
            if "hosts" in status:
                return Round.from_json(status)
            missing = status["waiting_for"]
            patience.waited(
                f"{', '.join(missing)} to join round {number} at the rendezvous at {address}:{port}",
                f"{len(missing)} worker(s) never joined: {', '.join(missing)}",
            )
        stop.wait(POLL_SECONDS)
    return None


def first_round_closed(
    address: str, port: int, timeout_seconds: float, stop: threading.Event, on_wait: Callable[[str], None] = lambda text: None
) -> bool:
    """Whether the gang's first round has closed: then a worker joining is one that comes back to
    an elastic gang, whose training processes join a round themselves once ready. Waits for the
    rendezvous to answer as `join_round` does (False if `stop` is set first)."""
    patience = _Patience(address, port, timeout_seconds, on_wait)
    while not stop.is_set():
        try:
            return "hosts" in _request(address, port, "GET", "/caramel/round/0")
        except OSError as error:
            patience.waited(f"the rendezvous at {address}:{port}", str(error))
        stop.wait(POLL_SECONDS)
    return False


def closed_round(address: str, port: int, number: int) -> Round:
    """Round `number`, closed (a training process asks for the round its ranks come from)."""
    status = _request(address, port, "GET", f"/caramel/round/{number}")
    if "hosts" not in status:
        raise RuntimeError(f"round {number} at the rendezvous at {address}:{port} has not closed")
    return Round.from_json(status)


def waiting_to_join(address: str, port: int, after: int) -> tuple[str, ...]:
    """The workers waiting in the round after `after` for the others to join it (none where it
    has not begun): an elastic gang's members ask, to take in a worker that came."""
    status = _request(address, port, "GET", f"/caramel/round/{after + 1}")
    if "hosts" in status:  # the others re-formed without this process (it was too slow to join): so must it
        return tuple(name for name, _ in status["hosts"])
    return tuple(status["joined"])


def _request(
    address: str,
    port: int,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """One request to the rendezvous and its JSON answer. Connection failures are OSErrors (the
    server is not up yet); a refusal is a RuntimeError with the server's reason."""
    connection = http.client.HTTPConnection(address, port, timeout=timeout_seconds)
    try:
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None)
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
    except (http.client.HTTPException, json.JSONDecodeError) as error:
        raise ConnectionError(f"no rendezvous answer at {address}:{port}: {error}") from error
    finally:
        connection.close()
    if response.status == GONE:
        raise GangFinished(answer.get("error", "the gang has finished training"))
    if response.status != 200:
        raise RuntimeError(f"the rendezvous at {address}:{port} refused {method} {path}: {answer.get('error', response.status)}")
    return answer
