"""The tree transport over real sockets on 127.0.0.1: every rank a thread (or, to die, a process)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
import pytest

from caramel.allreduce.baseline_schedules import halving_doubling, hierarchical, ring
from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule
from caramel.allreduce.multitree_schedule import multitree
from caramel.allreduce.replay import replay
from caramel.collectives.tree_transport import SUPPORTED_DTYPES, TransportError, TreeTransport
from caramel.network.model import Link, Topology
from caramel.network.synthetic import racks, torus
from conftest import REPO, free_port_block

DTYPES = {name: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for name in SUPPORTED_DTYPES}
SMALL_PIECES = 24  # bytes: many pieces per chunk even in small buffers


def addresses(size: int) -> list[tuple[str, int]]:
    first = free_port_block(size)
    return [("127.0.0.1", first + rank) for rank in range(size)]


def outcomes(size: int, work: Callable[[int], object], timeout: float = 60) -> list:
    """work(rank) in one thread per rank: what each returned or raised, in rank order."""
    results: list = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except Exception as error:  # handed to the test's thread
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results


def on_every_rank(size: int, work: Callable[[int], object], timeout: float = 60) -> list:
    """work(rank) in one thread per rank; the results in rank order, or the first exception."""
    results = outcomes(size, work, timeout)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def connect(schedule: Schedule, piece_bytes: int = SMALL_PIECES) -> list[TreeTransport]:
    where = addresses(schedule.hosts)
    return on_every_rank(schedule.hosts, lambda rank: TreeTransport(schedule, rank, where, piece_bytes=piece_bytes))


def allreduce(transports: Sequence[TreeTransport], buffers: Sequence[np.ndarray], sequence: int) -> list[np.ndarray]:
    return on_every_rank(len(transports), lambda rank: transports[rank].allreduce(buffers[rank], sequence))


def close(transports: Sequence[TreeTransport]) -> None:
    for transport in transports:
        transport.close()


def two_racks(size: int) -> Topology:
    """`size` ranks on two racks (the second one larger by one when size is odd), uplink at 1/4."""
    hosts = tuple(f"h{rank}" for rank in range(size))
    links = [Link(host, f"rack{rank * 2 // size}", 4.0) for rank, host in enumerate(hosts)]
    return Topology(hosts, ("rack0", "rack1"), (*links, Link("rack0", "rack1", 1.0)))


SCHEDULES: dict[str, Callable[[int], Schedule]] = {
    "multitree-two-racks": lambda size: multitree(two_racks(size)),
    "multitree-flat": lambda size: multitree(racks(1, size, 1.0, 1.0)),
    "ring": lambda size: ring(racks(1, size, 1.0, 1.0)),
    "halving-doubling": lambda size: halving_doubling(racks(1, size, 1.0, 1.0)),
}


@pytest.mark.parametrize("size", range(1, 9))
@pytest.mark.parametrize("algorithm", sorted(SCHEDULES))
def test_averages_equal_replay_and_numpy_for_every_size_and_dtype(algorithm, size):
    schedule = SCHEDULES[algorithm](size)
    transports = connect(schedule)
    rng = np.random.default_rng(size)
    sequence = 0
    try:
        # Sizes: empty, fewer elements than chunks, one piece, many pieces, uneven chunks.
        for elements in (0, 1, size - 1, size + 1, 7 * size + 3, 301):
            for name, dtype in DTYPES.items():
                # Small integers: sums are exact in every dtype, so the only rounding is the
                # division, the same one in the reference.
                buffers = [rng.integers(-8, 9, elements).astype(dtype) for _ in range(size)]
                expected = [np.divide(result, size, out=result) for result in replay(schedule, buffers)]
                results = allreduce(transports, buffers, sequence)
                sequence += 1
                for rank, result in enumerate(results):
                    assert result.dtype == dtype and result.shape == (elements,)
                    np.testing.assert_array_equal(result.astype(np.float64), expected[rank].astype(np.float64))
                    exact = np.sum([b.astype(np.float64) for b in buffers], axis=0) / size
                    np.testing.assert_allclose(result.astype(np.float64), exact, rtol=1e-2)
    finally:
        close(transports)


@pytest.mark.parametrize(
    ("name", "topology"),
    [("torus-3x3", torus(3, 3, 1.0)), ("racks-2x4", racks(2, 4, 4.0, 1.0)), ("uneven-racks", two_racks(7))],
)
def test_random_gradients_of_any_shape_average_like_numpy(name, topology):
    transports = connect(multitree(topology), piece_bytes=4096)
    rng = np.random.default_rng(7)
    try:
        for sequence, shape in enumerate([(1000, 7), (3, 5, 11), (100003,)]):
            buffers = [rng.standard_normal(shape).astype(np.float32) for _ in range(topology.size)]
            originals = [buffer.copy() for buffer in buffers]
            results = allreduce(transports, buffers, sequence)
            exact = np.mean(np.array(buffers, dtype=np.float64), axis=0)
            for result in results:
                assert result.shape == shape
                np.testing.assert_allclose(result, exact, rtol=1e-5, atol=1e-6)
            for buffer, original in zip(buffers, originals):
                np.testing.assert_array_equal(buffer, original)  # inputs are left as they were
    finally:
        close(transports)


def test_out_receives_the_average_and_may_be_the_buffer_itself():
    transports = connect(multitree(two_racks(3)))
    try:
        buffers = [np.full((4, 5), float(rank)) for rank in range(3)]
        outs = [np.empty((4, 5)) for _ in range(3)]
        results = on_every_rank(3, lambda rank: transports[rank].allreduce(buffers[rank], 0, out=outs[rank]))
        assert all(result is out and np.array_equal(out, np.ones((4, 5))) for result, out in zip(results, outs))
        assert np.array_equal(buffers[2], np.full((4, 5), 2.0))  # left as it was
        on_every_rank(3, lambda rank: transports[rank].allreduce(buffers[rank], 1, out=buffers[rank]))
        assert all(np.array_equal(buffer, np.ones((4, 5))) for buffer in buffers)  # in place
    finally:
        close(transports)


def test_hierarchical_schedule_runs_too():
    schedule = hierarchical(racks(2, 3, 1.0, 1.0))
    transports = connect(schedule)
    try:
        buffers = [np.full(50, rank, dtype=np.float64) for rank in range(6)]
        assert all(np.array_equal(result, np.full(50, 2.5)) for result in allreduce(transports, buffers, 0))
    finally:
        close(transports)


def test_concurrent_calls_run_in_sequence_order_and_each_returns_its_own_result():
    size, calls = 4, 6
    transports = connect(multitree(two_racks(size)), piece_bytes=1024)
    # Call k of rank r holds r + 10 k everywhere: its average identifies the call.
    buffers = [[np.full(5000, rank + 10.0 * call, dtype=np.float32) for call in range(calls)] for rank in range(size)]

    def rank_calls(rank: int) -> list[np.ndarray]:
        # The calls start in a different order on every rank, the last sequences first on some.
        order = list(range(calls))[::-1] if rank % 2 else [2, 0, 5, 1, 4, 3]
        results: list = [None] * calls

        def call(k: int) -> None:
            results[k] = transports[rank].allreduce(buffers[rank][k], k)

        threads = []
        for k in order:
            threads.append(threading.Thread(target=call, args=(k,)))
            threads[-1].start()
            time.sleep(0.01)
        for thread in threads:
            thread.join(30)
        return results

    try:
        for rank_results in on_every_rank(size, rank_calls):
            for call, result in enumerate(rank_results):
                np.testing.assert_array_equal(result, np.full(5000, 1.5 + 10.0 * call, dtype=np.float32))
    finally:
        close(transports)


def test_bad_calls_are_refused_by_name():
    (transport,) = connect(multitree(racks(1, 1, 1.0, 1.0)))
    try:
        with pytest.raises(TypeError, match="dtype int32 is not supported; use one of float32"):
            transport.allreduce(np.zeros(3, dtype=np.int32), 0)
        with pytest.raises(TypeError, match="expected a numpy array, got list"):
            transport.allreduce([1.0], 0)
        with pytest.raises(ValueError, match="sequence must be a whole number from 0 up, got -1"):
            transport.allreduce(np.zeros(3), -1)
        with pytest.raises(ValueError, match="out: expected a writable, C-contiguous numpy array of the buffer's shape"):
            transport.allreduce(np.zeros(3), 0, out=np.zeros(4))
        np.testing.assert_array_equal(transport.allreduce(np.ones(3), 0), np.ones(3))
        with pytest.raises(ValueError, match="sequence 0 was already used on rank 0"):
            transport.allreduce(np.zeros(3), 0)
    finally:
        transport.close()


def test_ranks_that_disagree_on_the_buffer_fail_with_both_shapes_named():
    transports = connect(multitree(racks(1, 2, 1.0, 1.0)))
    try:
        errors = outcomes(2, lambda rank: transports[rank].allreduce(np.zeros(10 + rank, np.float32), 0))
        assert all(isinstance(error, TransportError) for error in errors)
        # The rank that notices names both shapes; the other loses it and says so.
        assert any(re.search(r"rank \d \(127.0.0.1:\d+\) reduces 1\d float32 elements, rank \d 1\d float32", str(e)) for e in errors)
    finally:
        close(transports)


def test_a_missing_peer_is_named_with_its_address():
    where = addresses(2)
    schedule = multitree(racks(1, 2, 1.0, 1.0))
    with pytest.raises(TransportError, match=rf"rank 1 could not connect to rank 0 at 127.0.0.1:{where[0][1]} within 0.5 s"):
        TreeTransport(schedule, 1, where, connect_timeout=0.5)
    with pytest.raises(TransportError, match=rf"rank 0: no connection on port {where[0][1]} from rank\(s\) 1 \(127.0.0.1\) within 0.5 s"):
        TreeTransport(schedule, 0, where, connect_timeout=0.5)


def test_ranks_with_different_schedules_refuse_each_other():
    where = addresses(2)
    schedules = [multitree(racks(1, 2, 1.0, 1.0)), ring(racks(1, 2, 1.0, 1.0))]
    errors = outcomes(2, lambda rank: TreeTransport(schedules[rank], rank, where, connect_timeout=5))
    for rank, error in enumerate(errors):  # each side names the other
        assert isinstance(error, TransportError)
        assert f"rank {rank}: rank {1 - rank} at 127.0.0.1" in str(error) and "runs another schedule" in str(error)


def test_ranks_with_different_piece_sizes_refuse_each_other():
    schedule = multitree(racks(1, 2, 1.0, 1.0))
    where = addresses(2)
    errors = outcomes(2, lambda rank: TreeTransport(schedule, rank, where, connect_timeout=5, piece_bytes=64 << rank))
    assert all("cuts pieces of" in str(error) for error in errors), errors


def test_connections_take_the_congestion_control_asked_for_or_keep_the_default(caplog):
    schedule = multitree(racks(1, 2, 1.0, 1.0))
    where = addresses(2)
    transports = on_every_rank(2, lambda rank: TreeTransport(schedule, rank, where, congestion_control="reno"))
    try:
        for transport in transports:
            (connection,) = transport._connections.values()
            assert connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0") == b"reno"
    finally:
        close(transports)
    where = addresses(2)
    transports = on_every_rank(2, lambda rank: TreeTransport(schedule, rank, where, congestion_control="no-such"))
    close(transports)
    assert "keeps the system's TCP congestion control: no-such" in caplog.text


def test_a_schedule_the_executor_cannot_run_by_dependencies_is_refused():
    # Rank 1 would send chunk 0 up before the partial sum from rank 2 has arrived.
    late = Schedule(
        "late", 3, 1,
        reduce_scatter=(ChunkTransfer(0, 1, 0, 0), ChunkTransfer(0, 2, 1, 0, steps=2)),
        all_gather=(ChunkTransfer(0, 0, 1, 0), ChunkTransfer(1, 1, 2, 0)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="rank 1, chunk 0: a partial sum arrives after the rank has sent its own"):
        TreeTransport(late, 1, addresses(3))


def test_ranks_that_finish_and_close_at_once_fail_nobody_still_finishing():
    # Rank 0 may return while ranks it fed still wait for others' data: its close must not
    # take those ranks down.
    schedule = multitree(two_racks(8))
    for _ in range(3):
        transports = connect(schedule, piece_bytes=1 << 16)

        def reduce_and_close(rank: int) -> np.ndarray:
            try:
                return transports[rank].allreduce(np.full(1 << 18, float(rank), np.float32), 0)
            finally:
                transports[rank].close()

        for result in on_every_rank(8, reduce_and_close):
            np.testing.assert_array_equal(result, np.full(1 << 18, 3.5, np.float32))


def test_a_peer_that_left_fails_the_next_call_by_name():
    transports = connect(multitree(racks(1, 2, 1.0, 1.0)))
    allreduce(transports, [np.ones(4), np.ones(4)], 0)
    transports[1].close()
    with pytest.raises(TransportError, match=r"all-reduce 1 on rank 0 failed: rank 0 lost rank 1 \(127.0.0.1:\d+\)"):
        transports[0].allreduce(np.ones(4), 1)
    transports[0].close()


DYING_RANK = """
import sys, time
from caramel.allreduce.multitree_schedule import multitree
from caramel.collectives.tree_transport import TreeTransport
from caramel.network.synthetic import racks
where = [("127.0.0.1", int(port)) for port in sys.argv[1:]]
transport = TreeTransport(multitree(racks(1, len(where), 1.0, 1.0)), len(where) - 1, where)
print("connected", flush=True)
time.sleep(60)
"""


def test_a_killed_peer_fails_the_others_promptly_naming_it():
    size = 3
    where = addresses(size)
    dying = subprocess.Popen(
        [sys.executable, "-c", DYING_RANK, *(str(port) for _, port in where)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        schedule = multitree(racks(1, size, 1.0, 1.0))
        transports = on_every_rank(size - 1, lambda rank: TreeTransport(schedule, rank, where))
        assert dying.stdout.readline().strip() == "connected"
        started = []

        def reduce(rank: int) -> None:
            started.append(time.monotonic())
            transports[rank].allreduce(np.ones(10**6, np.float32), 0)  # waits on the sleeping rank

        timer = threading.Timer(0.5, dying.kill)
        timer.start()
        errors = outcomes(size - 1, reduce, timeout=20)
        assert time.monotonic() - min(started) < 5
        assert all(isinstance(error, TransportError) for error in errors)
        # Its neighbours name it; ranks not connected to it lose a neighbour, which then stopped.
        assert any(f"lost rank {size - 1} (127.0.0.1:{where[-1][1]}): " in str(error) for error in errors)
        with pytest.raises(TransportError, match="failed"):  # and every later call
            transports[0].allreduce(np.ones(3, np.float32), 1)
        close(transports)
    finally:
        dying.kill()
        dying.wait()
