"""MULTITREE's executor: runs an all-reduce `Schedule` between the ranks of a job, over TCP.

    transport = TreeTransport(multitree(topology), rank, addresses)   # connects to its peers
    average = transport.allreduce(gradient, sequence)                  # from any thread
    transport.close()

Only the tree algorithm is written here; every other collective stays Horovod's.

Connections. Every rank listens on its own address's port. Each pair of ranks the schedule
moves data between shares one TCP connection; the higher rank connects to the lower. A
handshake checks that both ends run the same schedule (so ranks that derived it from different
topologies fail at once, by name). Setup waits up to `connect_timeout` seconds for every peer,
then names those that did not answer.

Data path. The buffer is cut into the schedule's chunks (`chunk_bounds`), and each chunk into
pieces of about `piece_bytes`: every (chunk, piece) follows the chunk's trees on its own, so a
piece moves on as soon as it is ready instead of waiting for its whole chunk (cut-through; the
trees stay the schedule's, only their pipeline fill shrinks). Per piece and rank:
- reduce-scatter: once every partial sum the schedule sends this rank has been added in, the
  piece goes on to the ranks the schedule sends it to; where this rank receives no finished
  chunk (it roots the chunk's tree), the piece is final: it is divided by the world size and
  the all-gather starts from it;
- all-gather: the finished piece is received into place and forwarded.
That is the schedule's meaning (`caramel.allreduce.replay`) with its time steps relaxed into
their dependencies; `_plan` checks that the schedule has the shape for which both agree.
Each connection has a sender thread (one queue of ready pieces) and a receiver thread (which
adds or stores what arrives). Python does bookkeeping per piece only: the bytes move in
`sendmsg`/`recv_into` on memoryviews and the sums in numpy's in-place ufuncs, which all release
the GIL.

Several calls, one at a time. `allreduce(buffer, sequence)` may be called from several threads
at once; the calls run one after another in `sequence` order (0, 1, 2, ...), the same on every
rank, so ranks never wait on each other's different collectives. Messages carry the sequence,
so a peer already in the next collective is simply waited for.

Failures. A peer whose connection closes or breaks (it closed its transport, or died and its
kernel closed or reset the connection) fails the collective in progress if that still needs
data from it, and otherwise the next call, with an error naming the peer. A rank that fails
closes its own connections, so that the peers waiting for it fail promptly too rather than
hang; a rank that simply finished and closed fails nobody.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from caramel.allreduce.chunk_schedule import ChunkTransfer, Schedule, chunk_bounds

SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16")
"""The dtypes `allreduce` takes, by numpy name; bfloat16 is TensorFlow's (the ml_dtypes type)."""

PIECE_BYTES = 256 * 1024
"""Pieces of 256 KiB: a tree hop delays a piece by only 2 ms at 1 Gbit/s, while per-piece
Python work (some tens of microseconds) stays far below the time the bytes take. Measured on
two emulated racks (`benchmarks/topology_bench.py --piece-kib`): 128 KiB to 1 MiB within the
machine's noise of each other, 64 KiB and 4 MiB slower."""

CONGESTION_CONTROL = "cubic"
"""TCP congestion control of the transport's connections, where the system lets a process choose
it. The trees send several flows through an uplink at once; a loss-based controller shares a
shallow-buffered uplink among them with few losses, where BBR (v1, some systems' default) keeps
probing: on two emulated racks, 5 to 20% of the segments retransmitted and retransmission
timeouts stalling pieces (all-reduce of 64 MiB 2.46 to 2.93 s, against 2.42 to 2.47 s with cubic)."""

CONNECT_TIMEOUT_SECONDS = 120.0
RETRY_SECONDS = 0.1
# Dead machines (no reset ever comes): keepalive probes after 10 s idle, every 5 s, 3 misses.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 10), (socket.TCP_KEEPINTVL, 5), (socket.TCP_KEEPCNT, 3))

REDUCE_SCATTER, ALL_GATHER = 0, 1
PHASES = ("reduce-scatter", "all-gather")
# sequence, phase, dtype (index in SUPPORTED_DTYPES), chunk, piece, elements of the whole buffer
HEADER = struct.Struct("<QBBxxIIQ")
MAGIC = b"CRMLTREE"
# magic, protocol version, sender rank, world size, schedule digest, piece size
HELLO = struct.Struct("<8sHII16sI")
PROTOCOL = 1


class TransportError(RuntimeError):
    """A connection could not be set up or was lost, or ranks disagree; the message names the peer."""


@dataclass(frozen=True)
class _Plan:
    """One rank's part of a schedule, per chunk: whom it hears from and whom it sends to."""

    partial_sums_from: tuple[tuple[int, ...], ...]
    """Reduce-scatter: ranks whose partial sums of the chunk this rank adds to its own."""
    partial_sums_to: tuple[tuple[int, ...], ...]
    """Reduce-scatter: ranks this rank sends its partial sum to, once it has added all of the above."""
    finished_from: tuple[int | None, ...]
    """All-gather: the rank this rank receives the finished chunk from; None where this rank
    holds it after the reduce-scatter (it roots the chunk's tree)."""
    finished_to: tuple[tuple[int, ...], ...]
    """All-gather: ranks this rank forwards the finished chunk to."""

    @property
    def peers(self) -> tuple[int, ...]:
        ranks = {
            rank
            for per_chunk in (self.partial_sums_from, self.partial_sums_to, self.finished_to)
            for ranks in per_chunk
            for rank in ranks
        }
        ranks.update(rank for rank in self.finished_from if rank is not None)
        return tuple(sorted(ranks))


def _plan(schedule: Schedule, rank: int) -> _Plan:
    """This rank's plan; ValueError where running pieces by their dependencies would not compute
    what the schedule's time steps compute (see the module's docstring)."""
    chunks = range(schedule.chunks)

    def by_chunk(transfers: Sequence[ChunkTransfer], mine) -> list[list[ChunkTransfer]]:
        grouped: list[list[ChunkTransfer]] = [[] for _ in chunks]
        for transfer in transfers:
            if mine(transfer):
                grouped[transfer.chunk].append(transfer)
        return grouped

    rs_in = by_chunk(schedule.reduce_scatter, lambda t: t.dst == rank)
    rs_out = by_chunk(schedule.reduce_scatter, lambda t: t.src == rank)
    ag_in = by_chunk(schedule.all_gather, lambda t: t.dst == rank)
    ag_out = by_chunk(schedule.all_gather, lambda t: t.src == rank)
    for chunk in chunks:
        where = f"{schedule.algorithm} schedule, rank {rank}, chunk {chunk}"
        if rs_in[chunk] and rs_out[chunk] and max(t.end for t in rs_in[chunk]) > min(t.step for t in rs_out[chunk]):
            raise ValueError(f"{where}: a partial sum arrives after the rank has sent its own; not supported")
        if len(ag_in[chunk]) > 1:
            raise ValueError(f"{where}: the finished chunk arrives {len(ag_in[chunk])} times; not supported")
        if ag_in[chunk] and ag_out[chunk] and ag_in[chunk][0].end > min(t.step for t in ag_out[chunk]):
            raise ValueError(f"{where}: the finished chunk is forwarded before it arrives")
        if rs_out[chunk] and not ag_in[chunk]:
            raise ValueError(f"{where}: the rank sends its partial sum away but never gets the finished chunk")
    return _Plan(
        partial_sums_from=tuple(tuple(t.src for t in transfers) for transfers in rs_in),
        partial_sums_to=tuple(tuple(t.dst for t in transfers) for transfers in rs_out),
        finished_from=tuple(transfers[0].src if transfers else None for transfers in ag_in),
        finished_to=tuple(tuple(t.dst for t in transfers) for transfers in ag_out),
    )


def schedule_digest(schedule: Schedule) -> bytes:
    """16 bytes that differ between different schedules: what the handshake compares."""
    text = repr((schedule.algorithm, schedule.hosts, schedule.chunks, schedule.reduce_scatter, schedule.all_gather))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class _Collective:
    """One all-reduce in progress on this rank: its buffer, its pieces and what is left to do."""

    def __init__(
        self, sequence: int, work: np.ndarray, source: np.ndarray | None, plan: _Plan, piece_elements: int
    ) -> None:
        self.sequence = sequence
        self.work = work
        self.source = source
        """Where the rank's own values are, if not in `work` already: each piece is copied in at
        its first use (`own`), so the copy overlaps the communication instead of preceding it."""
        self.dtype_code = SUPPORTED_DTYPES.index(work.dtype.name)
        self.pieces: list[list[tuple[int, int]]] = []
        for start, stop in chunk_bounds(work.size, len(plan.partial_sums_from)):
            # At least one piece, empty or not, so every transfer is a message that ranks check.
            starts = range(start, max(stop, start + 1), piece_elements)
            self.pieces.append([(first, min(first + piece_elements, stop)) for first in starts])
        # Partial sums still to add, per chunk and piece; the chunk's lock guards the piece's sum.
        self.missing = [[len(plan.partial_sums_from[c])] * len(p) for c, p in enumerate(self.pieces)]
        self.locks = [threading.Lock() for _ in self.pieces]
        self.uncopied = [[source is not None] * len(p) for p in self.pieces]
        messages_per_piece = [
            len(plan.partial_sums_from[c]) + len(plan.partial_sums_to[c]) + len(plan.finished_to[c])
            + (plan.finished_from[c] is not None)
            for c in range(len(self.pieces))
        ]
        self.remaining = sum(count * len(p) for count, p in zip(messages_per_piece, self.pieces))
        """Messages still to send or receive; the collective is done at 0."""
        self.expected: Counter[int] = Counter()
        """Messages still to receive, per peer."""
        for chunk, pieces in enumerate(self.pieces):
            senders = [*plan.partial_sums_from[chunk], plan.finished_from[chunk]]
            self.expected.update({peer: len(pieces) for peer in senders if peer is not None})

    def piece(self, chunk: int, piece: int) -> np.ndarray:
        start, stop = self.pieces[chunk][piece]
        return self.work[start:stop]

    def own(self, chunk: int, piece: int) -> np.ndarray:
        """The piece, holding this rank's own values if nothing touched it yet. Every piece's
        first use is here: a partial sum added to it (under the chunk's lock) or, where no
        partial sum comes, its sending in the reduce-scatter."""
        values = self.piece(chunk, piece)
        # A piece is uncopied only where there is a source (see __init__).
        if self.source is not None and self.uncopied[chunk][piece]:
            start, stop = self.pieces[chunk][piece]
            np.copyto(values, self.source[start:stop])
            self.uncopied[chunk][piece] = False
        return values


class _Connection:
    """The socket to one peer, and the queue of pieces its sender thread sends."""

    def __init__(self, peer: int, sock: socket.socket, address: tuple[str, int]) -> None:
        self.peer = peer
        self.sock = sock
        self.address = address
        self.outbox: queue.SimpleQueue[tuple[_Collective, int, int, int] | None] = queue.SimpleQueue()

    def describe(self) -> str:
        return f"rank {self.peer} ({self.address[0]}:{self.address[1]})"


class TreeTransport:
    """All-reduce (average) of numpy buffers over TCP, following `schedule`, on rank `rank`.

    `addresses[r]` is where rank r listens: a host name or address and a port; this rank binds
    its own port on every interface. The constructor returns once every peer the schedule needs
    is connected, or raises TransportError naming those that are not. `congestion_control`
    names the TCP congestion control of the connections (None: the system's default); where the
    system refuses it, the default stays and a warning is logged.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        addresses: Sequence[tuple[str, int]],
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        piece_bytes: int = PIECE_BYTES,
        congestion_control: str | None = CONGESTION_CONTROL,
    ) -> None:
        if len(addresses) != schedule.hosts:
            raise ValueError(f"addresses: the schedule has {schedule.hosts} ranks, got {len(addresses)} addresses")
        if not 0 <= rank < schedule.hosts:
            raise ValueError(f"rank {rank} is outside 0..{schedule.hosts - 1}")
        if not 16 <= piece_bytes < 2**32:
            raise ValueError(f"piece_bytes must be within 16 bytes and 4 GiB, got {piece_bytes}")
        self.rank = rank
        self.size = schedule.hosts
        self.addresses = [(str(host), int(port)) for host, port in addresses]
        self._plan = _plan(schedule, rank)
        self._digest = schedule_digest(schedule)
        self._piece_bytes = piece_bytes
        self._state = threading.Condition()
        self._next = 0  # the sequence whose turn it is
        self._claimed: set[int] = set()  # sequences of calls waiting or running
        self._current: _Collective | None = None
        self._failure: TransportError | None = None
        self._departed: dict[int, str] = {}  # peers whose connection ended: why
        self._closing = False
        self._connections = _connect(self.rank, self._plan.peers, self.addresses, self._hello(), connect_timeout)
        refused = [_configure(connection.sock, congestion_control) for connection in self._connections.values()]
        if any(refused):
            logging.getLogger(__name__).warning(
                "rank %d keeps the system's TCP congestion control: %s", rank, next(filter(None, refused))
            )
        self._threads = []
        for connection in self._connections.values():
            for role, loop in (("send", self._send_loop), ("receive", self._receive_loop)):
                thread = threading.Thread(
                    target=loop, args=(connection,), name=f"tree-{role}-{rank}-{connection.peer}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _hello(self) -> bytes:
        return HELLO.pack(MAGIC, PROTOCOL, self.rank, self.size, self._digest, self._piece_bytes)

    # -- what callers use ----------------------------------------------------------------

    def allreduce(self, buffer: np.ndarray, sequence: int, out: np.ndarray | None = None) -> np.ndarray:
        """The element-wise average of `buffer` over all ranks, in `out` (returned), or in a new
        array of `buffer`'s shape and dtype. `buffer` is left as it is unless it is `out`.

        Callable from several threads: calls run in `sequence` order, starting at 0, and every
        rank must make the same calls with the same shapes and dtypes. A caller that all-reduces
        the same shapes again and again saves the first touch of a fresh array's memory
        (page faults, on some machines huge-page compaction: more than the copy) by passing
        the same `out` each time."""
        if not isinstance(buffer, np.ndarray):
            raise TypeError(f"buffer: expected a numpy array, got {type(buffer).__name__}")
        if buffer.dtype.name not in SUPPORTED_DTYPES:
            raise TypeError(f"buffer: dtype {buffer.dtype.name} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
        if out is not None and not (
            isinstance(out, np.ndarray) and out.shape == buffer.shape and out.dtype == buffer.dtype
            and out.flags.c_contiguous and out.flags.writeable
        ):
            raise ValueError("out: expected a writable, C-contiguous numpy array of the buffer's shape and dtype")
        if not isinstance(sequence, int) or sequence < 0:
            raise ValueError(f"sequence must be a whole number from 0 up, got {sequence!r}")
        with self._state:
            if sequence < self._next or sequence in self._claimed:
                raise ValueError(f"sequence {sequence} was already used on rank {self.rank}; each call needs its own")
            self._claimed.add(sequence)
        try:
            if out is None:
                out = np.empty_like(buffer, order="C")
            source = None if out is buffer else np.ascontiguousarray(buffer).reshape(-1)
            work = out.reshape(-1)
            collective = _Collective(sequence, work, source, self._plan, max(1, self._piece_bytes // work.itemsize))
            with self._state:
                while self._next != sequence and not self._failure:
                    self._state.wait()
                # A peer that left after the last collective fails this one, and this rank's
                # other peers with it (checked with the turn taken, so no departure slips by).
                departed = self._departed and self._record(TransportError(next(iter(self._departed.values()))))
                if not self._failure:
                    self._current = collective
                    self._state.notify_all()  # receivers may hold this collective's first messages
            if departed:
                self._shut_down()
            self._raise_failure(sequence)
            try:
                # The pieces no partial sum comes for go out at once, every tree's first pieces first.
                leaves = [chunk for chunk in range(len(collective.pieces)) if not self._plan.partial_sums_from[chunk]]
                for piece in range(max((len(collective.pieces[chunk]) for chunk in leaves), default=0)):
                    for chunk in leaves:
                        if piece < len(collective.pieces[chunk]):
                            collective.own(chunk, piece)
                            self._reduced(collective, chunk, piece)
                with self._state:
                    while collective.remaining and not self._failure:
                        self._state.wait()
                    self._raise_failure(sequence)
            finally:
                with self._state:
                    self._current = None
                    self._next = sequence + 1
                    self._state.notify_all()
        finally:
            with self._state:
                self._claimed.discard(sequence)
        return out

    def close(self) -> None:
        """Close every connection; calls in progress or waiting raise TransportError."""
        with self._state:
            if self._closing:
                return
            self._closing = True
            self._record(TransportError(f"rank {self.rank}: the transport was closed"))
        self._shut_down()
        for thread in self._threads:
            thread.join(timeout=5)
        for connection in self._connections.values():
            connection.sock.close()

    def __enter__(self) -> TreeTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the pieces' dependencies --------------------------------------------------------

    def _reduced(self, collective: _Collective, chunk: int, piece: int) -> None:
        """Every partial sum of the piece that this rank adds has been added."""
        for peer in self._plan.partial_sums_to[chunk]:
            self._connections[peer].outbox.put((collective, REDUCE_SCATTER, chunk, piece))
        if self._plan.finished_from[chunk] is None:
            values = collective.piece(chunk, piece)
            np.divide(values, self.size, out=values)
            self._finished(collective, chunk, piece)

    def _finished(self, collective: _Collective, chunk: int, piece: int) -> None:
        """The piece holds its average on this rank: forward it."""
        for peer in self._plan.finished_to[chunk]:
            self._connections[peer].outbox.put((collective, ALL_GATHER, chunk, piece))

    def _count_message(self, collective: _Collective, sender: int | None = None) -> None:
        with self._state:
            collective.remaining -= 1
            if sender is not None:
                collective.expected[sender] -= 1
            if not collective.remaining:
                self._state.notify_all()

    # -- the threads of a connection -----------------------------------------------------

    def _send_loop(self, connection: _Connection) -> None:
        try:
            while (item := connection.outbox.get()) is not None:
                collective, phase, chunk, piece = item
                header = HEADER.pack(collective.sequence, phase, collective.dtype_code, chunk, piece, collective.work.size)
                _send_message(connection.sock, header, collective.piece(chunk, piece).view(np.uint8).data)
                self._count_message(collective)
        except OSError as error:
            # A peer that finished has received all it needed: a failed send is a failure.
            self._fail(self._lost(connection, f"sending failed: {error}"))

    def _receive_loop(self, connection: _Connection) -> None:
        header = bytearray(HEADER.size)
        scratch = np.empty(self._piece_bytes, dtype=np.uint8)
        try:
            while True:
                if not _receive_exactly(connection.sock, memoryview(header), at_boundary=True):
                    self._gone(connection, "it closed the connection")
                    return
                sequence, phase, dtype_code, chunk, piece, elements = HEADER.unpack(header)
                collective = self._collective(connection, sequence)
                if collective is None:
                    return
                self._check(connection, collective, phase, dtype_code, chunk, piece, elements)
                values = collective.piece(chunk, piece)
                if phase == ALL_GATHER:
                    _receive_exactly(connection.sock, values.view(np.uint8).data)
                    self._finished(collective, chunk, piece)
                else:
                    incoming = scratch[: values.nbytes].view(values.dtype)
                    _receive_exactly(connection.sock, scratch[: values.nbytes].data)
                    with collective.locks[chunk]:
                        np.add(collective.own(chunk, piece), incoming, out=values)
                        collective.missing[chunk][piece] -= 1
                        complete = not collective.missing[chunk][piece]
                    if complete:
                        self._reduced(collective, chunk, piece)
                self._count_message(collective, connection.peer)
        except (OSError, EOFError) as error:
            self._gone(connection, f"receiving failed: {error}")
        except TransportError as error:
            self._fail(error)

    def _collective(self, connection: _Connection, sequence: int) -> _Collective | None:
        """The collective a message belongs to, once this rank has started it; None when closing."""
        with self._state:
            while not self._failure and (self._current is None or self._current.sequence != sequence):
                if sequence < self._next:
                    raise TransportError(
                        f"{connection.describe()} sent data of all-reduce {sequence}, which rank {self.rank} has "
                        "finished: the ranks disagree on the schedule or the buffers"
                    )
                self._state.wait()
            return None if self._failure else self._current

    def _check(
        self, connection: _Connection, collective: _Collective, phase: int, dtype_code: int, chunk: int, piece: int,
        elements: int,
    ) -> None:
        """Both ranks must be in the same all-reduce, of the same buffer, at a place the plan expects."""
        plan = self._plan
        mine = f"{collective.work.size} {collective.work.dtype.name}"
        theirs = f"{elements} {SUPPORTED_DTYPES[dtype_code] if dtype_code < len(SUPPORTED_DTYPES) else '?'}"
        if (elements, dtype_code) != (collective.work.size, collective.dtype_code):
            raise TransportError(
                f"all-reduce {collective.sequence}: {connection.describe()} reduces {theirs} elements, rank "
                f"{self.rank} {mine}: every rank must make the same calls with the same shapes and dtypes"
            )
        expected = phase in (REDUCE_SCATTER, ALL_GATHER) and chunk < len(collective.pieces) and (
            connection.peer in plan.partial_sums_from[chunk] if phase == REDUCE_SCATTER
            else connection.peer == plan.finished_from[chunk]
        )
        if not expected or piece >= len(collective.pieces[chunk]):
            raise TransportError(
                f"all-reduce {collective.sequence}: {connection.describe()} sent piece {piece} of chunk {chunk} "
                f"in the {PHASES[phase] if phase < len(PHASES) else f'phase {phase}'}, which the schedule does not "
                f"send to rank {self.rank}"
            )

    # -- failures ------------------------------------------------------------------------

    def _lost(self, connection: _Connection, what: str) -> TransportError:
        return TransportError(
            f"rank {self.rank} lost {connection.describe()}: {what}; that worker has probably stopped or failed"
        )

    def _gone(self, connection: _Connection, what: str) -> None:
        """The peer's connection ended: a failure now if the collective in progress still needs
        data from it, else at the next call."""
        error = self._lost(connection, what)
        with self._state:
            self._departed[connection.peer] = str(error)
            needed = self._current is not None and self._current.expected[connection.peer] > 0
        if needed:
            self._fail(error)

    def _fail(self, error: TransportError) -> None:
        """Record the first failure, wake every waiting call, and close the connections so that
        this rank's peers fail promptly too."""
        with self._state:
            first = self._record(error)
        if first:
            self._shut_down()

    def _record(self, error: TransportError) -> bool:
        """With the state's lock held: keep the first failure and wake every waiting call; True
        if this was the first."""
        if self._failure:
            return False
        self._failure = error
        self._state.notify_all()
        return True

    def _raise_failure(self, sequence: int) -> None:
        if self._failure:
            raise TransportError(f"all-reduce {sequence} on rank {self.rank} failed: {self._failure}")

    def _shut_down(self) -> None:
        for connection in self._connections.values():
            connection.outbox.put(None)
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected


def _send_message(sock: socket.socket, header: bytes, payload: memoryview) -> None:
    """The header and the payload, in one system call where the socket takes both."""
    sent = sock.sendmsg([header, payload])
    if sent < len(header):
        sock.sendall(header[sent:])
        sent = len(header)
    if sent - len(header) < len(payload):
        sock.sendall(payload[sent - len(header) :])


def _receive_exactly(sock: socket.socket, view: memoryview, at_boundary: bool = False) -> bool:
    """Fill `view` from the socket. False if the peer closed before the first byte of a message
    (at_boundary); EOFError if it closed in the middle of one."""
    received = 0
    while received < len(view):
        count = sock.recv_into(view[received:], len(view) - received, socket.MSG_WAITALL)
        if not count:
            if at_boundary and not received:
                return False
            raise EOFError("the connection closed in the middle of a message")
        received += count
    return True


def _configure(sock: socket.socket, congestion_control: str | None) -> str | None:
    """Set a connection's options; why the congestion control could not be set, if it could not."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a piece's last segment must not wait
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
    if congestion_control:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion_control.encode())
        except OSError as error:  # not available, or not allowed to unprivileged processes
            return f"{congestion_control}: {error.strerror}"
    return None


def _connect(
    rank: int, peers: Sequence[int], addresses: Sequence[tuple[str, int]], hello: bytes, timeout: float
) -> dict[int, _Connection]:
    """One connection to each peer: accepted from higher ranks, made to lower ones."""
    deadline = time.monotonic() + timeout
    higher = {peer for peer in peers if peer > rank}
    accepted: dict[int, _Connection] = {}
    accept_errors: list[TransportError] = []
    listener = None
    if higher:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = addresses[rank][1]
        try:
            listener.bind(("", port))
            listener.listen(len(higher))
        except OSError as error:
            listener.close()
            raise TransportError(f"rank {rank} cannot listen on port {port}: {error.strerror}") from None
    acceptor = threading.Thread(
        target=_accept, args=(listener, rank, higher, addresses, hello, deadline, timeout, accepted, accept_errors), daemon=True
    )
    connections: dict[int, _Connection] = {}
    try:
        if listener:
            acceptor.start()
        for peer in sorted(peer for peer in peers if peer < rank):
            connections[peer] = _dial(rank, peer, addresses[peer], hello, deadline, timeout)
        if listener:
            acceptor.join()
        if accept_errors:
            raise accept_errors[0]
    except BaseException:
        for connection in [*connections.values(), *accepted.values()]:
            connection.sock.close()
        raise
    finally:
        if listener:
            listener.close()  # every peer is connected (or setup failed): nobody else may join
    return {**connections, **accepted}


def _dial(
    rank: int, peer: int, address: tuple[str, int], hello: bytes, deadline: float, timeout: float
) -> _Connection:
    where = f"rank {peer} at {address[0]}:{address[1]}"
    while True:
        try:
            sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as error:  # refused (not listening yet), unknown name (DNS not yet there), ...
            if time.monotonic() + RETRY_SECONDS > deadline:
                raise TransportError(
                    f"rank {rank} could not connect to {where} within {timeout:g} s: {error.strerror or error}"
                ) from None
            time.sleep(RETRY_SECONDS)
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.sendall(hello)
        _check_hello(rank, where, _read_hello(sock, where), hello)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return _Connection(peer, sock, address)


def _accept(
    listener: socket.socket | None,
    rank: int,
    expected: set[int],
    addresses: Sequence[tuple[str, int]],
    hello: bytes,
    deadline: float,
    timeout: float,
    accepted: dict[int, _Connection],
    errors: list[TransportError],
) -> None:
    """Accept the higher ranks' connections until all came or the deadline passed."""
    assert listener is not None
    port = addresses[rank][1]
    while expected - accepted.keys():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = ", ".join(f"{peer} ({addresses[peer][0]})" for peer in sorted(expected - accepted.keys()))
            errors.append(TransportError(
                f"rank {rank}: no connection on port {port} from rank(s) {missing} within {timeout:g} s"
            ))
            return
        listener.settimeout(remaining)
        try:
            sock, (host, _) = listener.accept()
        except socket.timeout:
            continue
        except OSError as error:
            errors.append(TransportError(f"rank {rank}: accepting on port {port} failed: {error.strerror}"))
            return
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            theirs = _read_hello(sock, f"a connection from {host}")
            peer = HELLO.unpack(theirs)[2]
            where = f"rank {peer} at {host}"
            sock.sendall(hello)  # before judging, so that a peer at fault learns why too
            _check_hello(rank, where, theirs, hello)
            if peer not in expected or peer in accepted:
                raise TransportError(f"rank {rank}: {where} connected, but the schedule does not pair them here")
            sock.settimeout(None)
        except (OSError, TransportError) as error:
            sock.close()
            errors.append(error if isinstance(error, TransportError) else TransportError(f"{host}: {error}"))
            return
        accepted[peer] = _Connection(peer, sock, addresses[peer])


def _read_hello(sock: socket.socket, where: str) -> bytes:
    hello = bytearray(HELLO.size)
    try:
        if not _receive_exactly(sock, memoryview(hello), at_boundary=True):
            raise EOFError("closed")
    except (OSError, EOFError) as error:
        raise TransportError(f"{where} did not complete the handshake: {error}") from None
    return bytes(hello)


def _check_hello(rank: int, where: str, theirs: bytes, mine: bytes) -> None:
    magic, protocol, _, size, digest, piece_bytes = HELLO.unpack(theirs)
    _, _, _, my_size, my_digest, my_piece_bytes = HELLO.unpack(mine)
    if magic != MAGIC or protocol != PROTOCOL:
        raise TransportError(f"{where} is not a Caramel tree transport of protocol {PROTOCOL}")
    if (size, digest) != (my_size, my_digest):
        raise TransportError(
            f"rank {rank}: {where} runs another schedule ({size} ranks): every rank must derive it from the same topology"
        )
    if piece_bytes != my_piece_bytes:
        raise TransportError(f"rank {rank}: {where} cuts pieces of {piece_bytes} bytes, this rank of {my_piece_bytes}")
