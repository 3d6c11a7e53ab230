"""Caramel's rendezvous (caramel.launch.rendezvous): workers join a round that closes once the whole
gang is there, a refused worker is told why, a wait ends by timeout or stop; and each closed round
serves the key-value store Horovod's Gloo meets at, as Horovod's own server does. The end-to-end
test runs Horovod's collectives over it with several ranks per worker (its local and cross scopes)."""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request

import pytest

from caramel.launch.gloo_store import scope_sizes
from caramel.launch.rendezvous import (
    LEASE_SECONDS,
    SETTLE_SECONDS,
    SURVIVOR_PATIENCE_SECONDS,
    Beats,
    GangFinished,
    Host,
    OpenRound,
    Refused,
    RendezvousServer,
    Round,
    Rounds,
    join_round,
    parse_hosts,
    waiting_to_join,
)
from conftest import free_port, job_manifest, needs_horovod, run_caramel, write_manifest

GANG = (Host("job-worker-0", 2), Host("job-worker-1", 2))


def test_a_round_closes_once_every_worker_of_the_gang_has_joined():
    rounds = Rounds(GANG)
    assert rounds.join(GANG[1]) == 0
    assert rounds.status(0) == OpenRound(0, joined=("job-worker-1",), waiting_for=("job-worker-0",))
    assert rounds.store is None
    assert rounds.join(GANG[0]) == 0
    assert rounds.status(0) == Round(0, GANG)
    assert rounds.store is not None
    assert rounds.join(GANG[1]) == 0  # a retried join is told the round it is in


FOUR = tuple(Host(f"job-worker-{index}", 1) for index in range(4))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_elastic_gangs_later_round_is_its_survivors_once_they_settle_and_takes_a_worker_back():
    clock = Clock()
    rounds = Rounds(FOUR, min_workers=3, settle_seconds=3.0, clock=clock)
    for host in FOUR:
        assert rounds.join(host, member=host.name) == 0
    assert rounds.status(0) == Round(0, FOUR)
    # Worker 2 is lost: the three others join round 1, which waits for it until they settle.
    for host in (FOUR[3], FOUR[0], FOUR[1]):
        assert rounds.join(host, member=host.name, after=0) == 1
    assert rounds.status(1) == OpenRound(1, joined=("job-worker-0", "job-worker-1", "job-worker-3"), waiting_for=("job-worker-2",))
    clock.now = 2.9
    assert isinstance(rounds.status(1), OpenRound)
    clock.now = 3.0
    survivors = Round(1, (FOUR[0], FOUR[1], FOUR[3]))
    assert rounds.status(1) == survivors
    assert survivors.rank_env("job-worker-3", 0)["HOROVOD_RANK"] == "2"
    # Worker 2 comes back (a new member under its name): it waits in round 2 until the others,
    # who see it there, join; the round closes at once with all of round 1 in, in worker order.
    assert rounds.join(FOUR[2], member="again") == 2
    assert rounds.status(2) == OpenRound(2, joined=("job-worker-2",), waiting_for=("job-worker-0", "job-worker-1", "job-worker-3"))
    clock.now = 100.0
    assert isinstance(rounds.status(2), OpenRound)  # a worker that came back never closes a round alone
    for host in (FOUR[0], FOUR[1], FOUR[3]):
        assert rounds.join(host, member=host.name, after=1) == 2
    assert rounds.status(2) == Round(2, FOUR)
    assert Round(2, FOUR).rank_env("job-worker-2", 0) == {
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_CROSS_RANK": "2", "HOROVOD_CROSS_SIZE": "4", "CARAMEL_ROUND": "2",
        "CARAMEL_ROUND_WORKERS": "job-worker-0,job-worker-1,job-worker-2,job-worker-3",
    }  # fmt: skip
    assert Round(1, (FOUR[0], FOUR[2])).rank_env("job-worker-2", 1)["CARAMEL_ROUND_WORKERS"] == "job-worker-0,job-worker-2"
    assert rounds.join(FOUR[2], member="again", after=1) == 2  # a retried join, or another process of that worker


def lost_worker_3_and_slow_worker_2() -> tuple[Rounds, Clock]:
    """Four alive workers in round 0; worker 3 is lost and says so, workers 0 and 1 join round 1
    at 10 s, and worker 2, a slow survivor, is still alive."""
    clock = Clock()
    rounds = Rounds(FOUR, min_workers=2, settle_seconds=3.0, clock=clock)
    for host in FOUR:
        rounds.join(host, member=host.name)
        rounds.alive(host.name, host.name)
    rounds.gone("job-worker-3", "job-worker-3")
    clock.now = 10.0
    for host in FOUR[:2]:
        rounds.join(host, member=host.name, after=0)
    return rounds, clock


def test_an_elastic_round_waits_for_a_survivor_whose_worker_is_alive_until_it_joins_or_is_gone():
    """The defect of a Keras survivor that freed its failed step for 12 s: the round closed 3 s
    after the others joined and left it out, while its worker still said it was alive."""
    rounds, clock = lost_worker_3_and_slow_worker_2()
    for now in (13.0, 20.0, 30.0):
        clock.now = now
        rounds.alive("job-worker-2", "job-worker-2")
        assert rounds.status(1) == OpenRound(1, joined=("job-worker-0", "job-worker-1"), waiting_for=("job-worker-2", "job-worker-3"))
    rounds.join(FOUR[2], member="job-worker-2", after=0)
    clock.now = 33.0
    assert rounds.status(1) == Round(1, FOUR[:3])


@pytest.mark.parametrize(
    "how_it_goes",
    ["says it is gone", "falls silent", "is waited for too long", "is replaced by a worker started again"],
)
def test_an_elastic_round_closes_without_a_survivor_that(how_it_goes):
    rounds, clock = lost_worker_3_and_slow_worker_2()
    clock.now = 13.0
    rounds.alive("job-worker-2", "job-worker-2")
    assert isinstance(rounds.status(1), OpenRound)
    if how_it_goes == "says it is gone":
        rounds.gone("job-worker-2", "job-worker-2")
    elif how_it_goes == "falls silent":
        clock.now = 13.0 + LEASE_SECONDS
    elif how_it_goes == "is waited for too long":
        for now in range(14, 10 + int(SURVIVOR_PATIENCE_SECONDS)):
            clock.now = now
            rounds.alive("job-worker-2", "job-worker-2")
            assert isinstance(rounds.status(1), OpenRound)
        clock.now = 10.0 + SURVIVOR_PATIENCE_SECONDS
    else:  # its old process is gone with its pod; the new one beats under another member id
        rounds.alive("job-worker-2", "again")
        clock.now = 13.0 + LEASE_SECONDS
    assert rounds.status(1) == Round(1, FOUR[:2])


def test_an_elastic_round_never_closes_without_worker_0_whose_state_the_others_take():
    clock = Clock()
    rounds = Rounds(FOUR, min_workers=2, settle_seconds=3.0, clock=clock)
    for host in FOUR:
        rounds.join(host)
    for host in FOUR[1:]:
        rounds.join(host, after=0)
    clock.now = 60.0
    assert isinstance(rounds.status(1), OpenRound)
    rounds.join(FOUR[0], after=0)
    assert rounds.status(1) == Round(1, FOUR)


def test_an_elastic_round_never_closes_below_the_fewest_workers():
    clock = Clock()
    rounds = Rounds(FOUR, min_workers=3, settle_seconds=3.0, clock=clock)
    for host in FOUR:
        rounds.join(host)
    for host in FOUR[:2]:
        rounds.join(host, after=0)
    clock.now = 60.0
    assert rounds.status(1) == OpenRound(1, joined=("job-worker-0", "job-worker-1"), waiting_for=("job-worker-2", "job-worker-3"))


def test_a_worker_waiting_to_rejoin_a_finished_gang_is_told_so():
    rounds = Rounds(FOUR, min_workers=3)
    for host in FOUR:
        rounds.join(host)
    assert rounds.finish() == ()
    with pytest.raises(GangFinished):
        rounds.join(FOUR[2], member="again")


def test_members_see_a_worker_waiting_to_rejoin_them_over_http():
    port = free_port()
    serving = RendezvousServer(port, GANG, min_workers=1)
    serving.start()
    try:
        stop = threading.Event()
        results: dict = {}
        threads = [join_in_thread(port, host, results, stop, []) for host in GANG]
        for thread in threads:
            thread.join(timeout=10)
        assert waiting_to_join("127.0.0.1", port, after=0) == ()
        def rejoin() -> None:
            try:
                join_round("127.0.0.1", port, GANG[1], 30, stop, member="new")
            except GangFinished as finished:
                results["late"] = finished

        late = threading.Thread(target=rejoin)
        late.start()
        for _ in range(40):
            if waiting_to_join("127.0.0.1", port, after=0):
                break
            stop.wait(0.05)
        assert waiting_to_join("127.0.0.1", port, after=0) == ("job-worker-1",)
        assert serving.rounds.finish() == ("job-worker-1",)
        late.join(timeout=5)
        assert isinstance(results["late"], GangFinished)
    finally:
        serving.stop()


def test_a_round_waits_over_http_for_a_worker_that_says_its_training_processes_run_until_they_end():
    port = free_port()
    serving = RendezvousServer(port, GANG, min_workers=1)
    serving.start()
    try:
        results: dict = {}
        threads = [join_in_thread(port, host, results, threading.Event(), []) for host in GANG]
        for thread in threads:
            thread.join(timeout=10)
        beats = Beats("127.0.0.1", port, "job-worker-1", member="")
        beats.start()
        # Worker 0's ranks broke and it meets again; worker 1 is alive, so round 1 waits past its settling.
        waiting = threading.Thread(target=lambda: results.__setitem__("again", join_round("127.0.0.1", port, GANG[0], 30, threading.Event(), after=0)))
        waiting.start()
        waiting.join(timeout=SETTLE_SECONDS + 0.5)
        assert waiting.is_alive()
        beats.end()
        waiting.join(timeout=5)
        assert results["again"] == Round(1, GANG[:1])
        assert request(port, "PUT", "/caramel/alive/stranger", b'{"member": "x", "alive": true}')[0] == 409
        assert json.loads(request(port, "PUT", "/caramel/alive/job-worker-1", b'{"alive": true}')[1]) == {
            "error": 'a word of life carries {"member": ID, "alive": true|false}'
        }
    finally:
        serving.stop()


def test_only_the_gangs_workers_join_with_their_slots():
    rounds = Rounds(GANG)
    with pytest.raises(Refused, match=r"job-worker-2 is not a worker of this gang \(job-worker-0, job-worker-1\)"):
        rounds.join(Host("job-worker-2", 2))
    with pytest.raises(Refused, match="job-worker-1 runs 1 training processes; the gang gives it 2"):
        rounds.join(Host("job-worker-1", 1))
    with pytest.raises(Refused, match="there is no round 1 yet"):
        rounds.status(1)


def test_the_hosts_of_the_contract_are_parsed_or_refused_by_name():
    assert parse_hosts("a-worker-0:1,a-worker-1:3") == (Host("a-worker-0", 1), Host("a-worker-1", 3))
    for bad in ("a-worker-0", "a-worker-0:0", ":2", "a:1,,b:1"):
        with pytest.raises(RuntimeError, match="CARAMEL_HOSTS is"):
            parse_hosts(bad)


def test_horovods_scopes_are_sized_from_the_hosts():
    assert scope_sizes([("w0", 2), ("w1", 1)]) == {"global": 3, "local_w0": 2, "local_w1": 1, "cross_0": 2, "cross_1": 1}


# How long the fixture's store holds a GET of a key that is not there (the contract's rendezvous
# timeout in a gang): short, so that a test sees the 404 that follows.
STORE_PATIENCE_SECONDS = 1.0


@pytest.fixture
def server():
    port = free_port()
    serving = RendezvousServer(port, GANG, store_patience_seconds=STORE_PATIENCE_SECONDS)
    serving.start()
    yield port
    serving.stop()


def join_in_thread(port: int, host: Host, results: dict, stop: threading.Event, messages: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.__setitem__(host.name, join_round("127.0.0.1", port, host, 30, stop, messages.append)))
    thread.start()
    return thread


def test_workers_meet_over_http_and_read_the_same_round(server):
    results, messages, stop = {}, [], threading.Event()
    first = join_in_thread(server, GANG[0], results, stop, messages)
    first.join(timeout=1)
    assert first.is_alive()  # waits for the other worker
    assert messages == [f"waiting for job-worker-1 to join round 0 at the rendezvous at 127.0.0.1:{server} (0 s)"]
    second = join_in_thread(server, GANG[1], results, stop, messages)
    for thread in (first, second):
        thread.join(timeout=10)
    assert results == {"job-worker-0": Round(0, GANG), "job-worker-1": Round(0, GANG)}


def test_a_refused_worker_is_told_why(server):
    with pytest.raises(RuntimeError, match="refused PUT /caramel/join/stranger: stranger is not a worker of this gang"):
        join_round("127.0.0.1", server, Host("stranger", 2), 5, threading.Event())


def test_a_wait_ends_at_its_timeout_or_when_stopped():
    port = free_port()  # nobody serves it
    with pytest.raises(TimeoutError, match=rf"timed out after 1 s waiting for the rendezvous at 127.0.0.1:{port}: "):
        join_round("127.0.0.1", port, GANG[1], 1, threading.Event())
    stop = threading.Event()
    stop.set()
    assert join_round("127.0.0.1", port, GANG[1], 30, stop) is None


def request(port: int, method: str, path: str, data: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method), timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_each_closed_round_serves_the_store_horovods_gloo_meets_at(server):
    """Horovod's HTTPStore: PUT /<scope>/<rank>, GET it (404 once the store's patience is out),
    DELETE once connected; the last of a scope's members to delete clears the scope, as Horovod's
    own server does."""
    assert request(server, "GET", "/global/0")[0] == 409  # no round closed: Horovod asks again
    rounds_closed = {}
    stop = threading.Event()
    threads = [join_in_thread(server, host, rounds_closed, stop, []) for host in GANG]
    for thread in threads:
        thread.join(timeout=10)
    assert request(server, "GET", "/global/1") == (404, b"")
    assert request(server, "PUT", "/global/1", b"\x00address of rank 1") == (200, b"")
    assert request(server, "GET", "/global/1") == (200, b"\x00address of rank 1")
    for rank in range(3):
        assert request(server, "DELETE", f"/global/{rank}")[0] == 200
    assert request(server, "GET", "/global/1") == (200, b"\x00address of rank 1")  # rank 3 has not finished
    request(server, "DELETE", "/global/3")
    assert request(server, "GET", "/global/1")[0] == 404
    # A scope the round does not size: DELETE removes that key alone, and a GET is not held.
    request(server, "PUT", "/adhoc/a", b"1")
    request(server, "PUT", "/adhoc/b", b"2")
    request(server, "DELETE", "/adhoc/a")
    assert [request(server, "GET", f"/adhoc/{key}")[0] for key in "ab"] == [404, 200]
    assert request(server, "GET", "/not/a/scope")[0] == 400
    assert json.loads(request(server, "GET", "/caramel/round/0")[1]) == Round(0, GANG).to_json()


HOROVOD_ON_SLOTS = """
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum).numpy().tolist()
print(f"ranks {hvd.rank()}/{hvd.size()} local {hvd.local_rank()}/{hvd.local_size()} cross {hvd.cross_rank()}/{hvd.cross_size()} sum {total}", flush=True)
"""


@pytest.mark.e2e
@needs_horovod
def test_horovods_collectives_meet_at_caramels_rendezvous_with_several_slots_per_worker(tmp_path):
    manifest = job_manifest(
        script=None, command=[sys.executable, "-c", HOROVOD_ON_SLOTS], args=[], workers={"replicas": 2, "slotsPerWorker": 2},
        caramel={"backend": "horovod"}, runPolicy={"backoffLimit": 0},
    )  # fmt: skip
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in range(4):
        assert f"rank {rank} | ranks {rank}/4 local {rank % 2}/2 cross {rank // 2}/2 sum [6.0]" in result.stderr, result.stderr[-4000:]


def test_a_get_of_a_key_not_there_is_held_until_it_comes_or_a_member_of_the_round_is_gone():
    """Issue 50: an elastic gang's ranks re-form with Gloo's 5 s peer timeout, which Horovod's
    HTTPStore also takes as its wait for the other ranks' keys; on a loaded node rank 0 gave up
    ("Wait timeout after 5 seconds for key(s): 1"). Held, the wait is the gang's."""
    for ending in ("put", "gone", "stop"):
        port = free_port()
        serving = RendezvousServer(port, GANG, min_workers=1, store_patience_seconds=30)
        serving.start()
        try:
            threads = [join_in_thread(port, host, {}, threading.Event(), []) for host in GANG]
            for thread in threads:
                thread.join(timeout=10)
            beats = Beats("127.0.0.1", port, "job-worker-1", member="")
            beats.start()
            answers: list = []
            held = threading.Thread(target=lambda: answers.append(request(port, "GET", "/global/1", timeout=60)))
            held.start()
            held.join(timeout=1.0)
            assert held.is_alive() and not answers, ending  # rank 1 is late: its key is not there yet
            if ending == "put":
                assert request(port, "PUT", "/global/1", b"address of rank 1") == (200, b"")
            elif ending == "gone":
                beats.end()  # worker 1 says its training processes ended: nobody waits for its key
            else:
                serving.stop()  # answers a held GET at once, so that stopping does not wait for it
            held.join(timeout=5)
            assert answers == [(200, b"address of rank 1") if ending == "put" else (404, b"")], ending
        finally:
            beats.end()
            serving.stop()
