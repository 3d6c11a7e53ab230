"""Caramel's side of Horovod's elastic training: how an elastic script's ranks re-form in the
process, at the gang's rendezvous, instead of through Horovod's driver (`horovodrun`, ssh and a
host-discovery script).

A gang runs elastic where its script enters `hvd.elastic.run` and spec.workers.minReplicas is
below replicas (`caramel.contract.elastic`); rank 0 says which, once. Then:
- a collective that fails because a peer was lost (Horovod's ops fail as soon as a peer's
  connection drops) is Horovod's `HorovodInternalError`;
- `reform()` joins the rendezvous's next round (`caramel.launch.rendezvous`: the workers alive),
  sets this process's ranks from it and re-forms the runtime's collectives in the process
  (`Runtime.reform`: Horovod's `shutdown()` and `init()`, a new gradient communicator);
- `restart_keeping(commit)` re-forms where the backend's ranks cannot in the process (the
  tensorflow backend: its collective executor and coordination service serve one cluster per
  process): it runs the training command again in this process (`os.execv`: the same process to
  its worker, which goes on relaying its output), which joins the next round as it starts and
  takes back its former self's last commit (`carried_commit()`);
- `newcomers()`: workers waiting at the rendezvous to join, which the ranks take in at their next
  `commit()` (Horovod's `HostsUpdatedInterrupt`).
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import tensorflow as tf

from caramel.collectives.backend import chosen
from caramel.contract.api import Backend as BackendChoice
from caramel.contract.elastic import elastic_notice, fixed_notice
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, WorkerContract
from caramel.launch.rendezvous import (
    JOIN_WHEN_READY,
    MEMBER_VARIABLE,
    POLL_SECONDS,
    ROUND_VARIABLE,
    GangFinished,
    Round,
    closed_round,
    join_round,
    parse_hosts,
    waiting_to_join,
)
from caramel.tensorflow.runtime import current
from horovod._caramel_support import refuse
from horovod.tensorflow import _caramel_final_check, _caramel_horovod_ops

try:  # Horovod's own classes where Horovod is installed, so that scripts catching them by either name catch them
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
except ImportError:

    class HorovodInternalError(RuntimeError):  # type: ignore[no-redef]
        """A collective failed: a peer was lost. The elastic ranks roll back to their last commit and re-form."""

    class HostsUpdatedInterrupt(RuntimeError):  # type: ignore[no-redef]
        """Workers joined (or left): the elastic ranks re-form with them, keeping their state."""

        def __init__(self, skip_sync: bool) -> None:
            super().__init__()
            self.skip_sync = skip_sync


# How long a collective of an elastic gang on the horovod backend waits for a peer
# (HOROVOD_GLOO_TIMEOUT_SECONDS once it trains): Horovod's background threads exchange a message
# every cycle (1 ms) even while their scripts do something else, so a peer silent this long is gone. A lost peer fails the survivors'
# collectives at once where its connection drops, but one blocked on a peer that is itself waiting
# at the rendezvous learns it only so (measured: 190 s and more with the gang's start-up timeout).
PEER_TIMEOUT_SECONDS = 5
CARRIED_COMMIT_VARIABLE = "CARAMEL_CARRIED_COMMIT"
"""The file in which a training process that restarted to re-form finds its former self's last
commit (and when its ranks broke, for the log), read once and removed."""

_entered = False
"""Whether this process entered `hvd.elastic.run` before."""
_restarted_into: Round | None = None
"""The round this process joined, where it restarted to re-form (`join_when_ready`)."""


def enter() -> bool:
    """Whether the gang runs elastic, checked where a script enters `hvd.elastic.run`: refused with
    Caramel's own TrainingRun; rank 0 says which, once."""
    global _entered
    runtime = current()
    runtime.drive(
        "hvd.elastic.run",
        "TrainingRun rolls back to its checkpoint, restarting the whole gang; train either with hvd.elastic "
        "(its ranks re-form in the process, from the last commit) or with TrainingRun",
    )
    workers = runtime.contract.full_world_size // runtime.contract.slots_per_worker
    elastic = is_elastic()
    if elastic and _caramel_horovod_ops.registered():
        refuse("process sets in an elastic gang", "a process set is of one set of ranks, which the gang re-forms: use them "
               "in a fixed gang (spec.workers.minReplicas equal to replicas), or train elastic without them")  # fmt: skip
    first, _entered = not _entered, True
    if elastic:
        runtime.metrics.record_elastic()  # the operator then replaces a lost worker instead of restarting the gang
    if elastic and first and not runtime.backend.reforms:
        _watch_for_broken_ranks(runtime.contract)
    elif elastic and first and _round() == 0:
        # The gang formed with the start-up timeout; every rank enters here at once, and forms
        # the same ranks again with the peer timeout, without the rendezvous.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(PEER_TIMEOUT_SECONDS)
        runtime.reform(lambda: None)
        _caramel_final_check.rearm()
    if first and _round() == 0:  # a process restarted to re-form said it before
        runtime.say(elastic_notice(workers, runtime.contract.min_workers) if elastic else fixed_notice(workers))
    return elastic


@contextmanager
def lost_peers_raised() -> Iterator[None]:
    """A collective that failed because a peer was lost (as the backend tells) raised as Horovod's
    HorovodInternalError."""
    try:
        yield
    except tf.errors.OpError as error:
        backend = current().backend
        if backend.lost_peer(error):
            # Leave the broken ranks now, not once the failed step is freed (a Keras fit's data
            # iterator can take seconds): a peer blocked on this rank fails at once instead of
            # after the peer timeout.
            backend.leave()
            raise HorovodInternalError(error) from error
        raise


def join_when_ready() -> None:
    """A training process that joins an elastic gang's ranks itself, once ready to train, before its
    backend starts: one of a worker that came back to the gang (JOIN_WHEN_READY) joins the open
    round, and one restarted to re-form (`restart_keeping`) the round after its former self's; each
    takes its ranks from the round joined, the first with the peer timeout on the horovod backend.
    Where the gang finished meanwhile, there is nothing to do."""
    global _restarted_into
    restarted = CARRIED_COMMIT_VARIABLE in os.environ
    if os.environ.get(ROUND_VARIABLE) != JOIN_WHEN_READY and not restarted:
        return
    contract = WorkerContract.from_env()
    try:
        met = _meet(contract, int(os.environ.get("HOROVOD_LOCAL_RANK") or 0), after=_round() if restarted else -1)
    except GangFinished:
        print("caramel: the gang finished training before this worker rejoined it", file=sys.stderr, flush=True)
        sys.exit(0)
    if restarted:
        _restarted_into = met
    # Not on the tensorflow backend: its collectives keep the contract's timeout, since a peer
    # silent for seconds there is in a long computation (a lost one fails them at once).
    elif chosen(contract) is BackendChoice.HOROVOD:
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(PEER_TIMEOUT_SECONDS)


def newcomers() -> tuple[str, ...]:
    """Workers waiting at the rendezvous to join this elastic gang's ranks."""
    runtime = current()
    return waiting_to_join(runtime.contract.rendezvous_addr, runtime.contract.rendezvous_port, _round())


def reform() -> None:
    """Re-form the ranks in this process with the workers alive, met at the rendezvous's next round."""
    runtime = current()
    started = time.monotonic()
    met: list[Round] = []
    runtime.reform(lambda: met.append(_meet(runtime.contract, runtime.backend.local_rank, after=_round())))
    # Horovod's init registered its shutdown at exit again: the weights check must run before it.
    _caramel_final_check.rearm()
    workers = ", ".join(member.name for member in met[0].hosts)
    runtime.say(f"ranks re-formed in round {met[0].number} of the rendezvous: {runtime.size} ranks ({workers}) after {time.monotonic() - started:.1f} s")


def _watch_for_broken_ranks(contract: WorkerContract) -> None:
    """Where the ranks re-form by restarting (`restart_keeping`), leave them as soon as a worker of
    this process's round joins the next one, from a thread: its ranks broke (a peer was lost, or
    took one in). A survivor in the middle of a step's computation when the others failed would
    otherwise next wait on a restarted peer for a collective that no process of the new ranks
    runs, and TensorFlow's collectives have no peer timeout short enough (a peer's computation
    can take as long)."""
    address, port, number = contract.rendezvous_addr, contract.rendezvous_port, _round()
    backend = current().backend

    def watch() -> None:
        members: set[str] = set()
        while True:
            time.sleep(POLL_SECONDS)
            try:
                members = members or {host.name for host in closed_round(address, port, number).hosts}
                joined = waiting_to_join(address, port, number)
            except GangFinished:
                return
            except (OSError, RuntimeError):
                continue  # worker 0 busy, or gone: the ranks' own collectives tell
            if members.intersection(joined):
                backend.leave()
                return

    threading.Thread(target=watch, name="caramel-broken-ranks", daemon=True).start()


def reforms_in_process() -> bool:
    """Whether the ranks re-form in this process (`reform`); otherwise it restarts (`restart_keeping`)."""
    return current().backend.reforms


def restart_keeping(commit: bytes) -> NoReturn:
    """Re-form the ranks by running the training command again in this process (`os.execv`: to its
    worker the same process, whose output it goes on relaying), with the state's last commit: the
    process started so joins the rendezvous's next round before its backend starts
    (`join_when_ready`), and takes the commit back before it synchronizes with the others
    (`carried_commit`). It meets the others only then, so that no process of the old ranks is left
    when the new ones connect."""
    with tempfile.NamedTemporaryFile(prefix="caramel-commit-", delete=False) as kept:
        kept.write(pickle.dumps((commit, time.time())))
    os.environ[CARRIED_COMMIT_VARIABLE] = kept.name
    runtime = current()
    runtime.say(f"the ranks broke: the training processes restart to re-form ({runtime.backend.name} backend), keeping the last commit")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def carried_commit() -> bytes | None:
    """The last commit of this process's former self, where it restarted to re-form (`restart_keeping`)."""
    path = os.environ.pop(CARRIED_COMMIT_VARIABLE, None)
    if path is None:
        return None
    with open(path, "rb") as kept:
        commit, broke_at = pickle.loads(kept.read())
    os.remove(path)
    if _restarted_into:
        workers = ", ".join(member.name for member in _restarted_into.hosts)
        current().say(
            f"ranks re-formed in round {_restarted_into.number} of the rendezvous: {_restarted_into.world_size} ranks ({workers}), "
            f"their training processes restarted with the last commit ({current().backend.name} backend) "
            f"{time.time() - broke_at:.1f} s after the ranks broke"
        )
    return commit


def _meet(contract: WorkerContract, slot: int, after: int) -> Round:
    """Join the round after `after` at the rendezvous, and set this process's ranks in it."""
    host = parse_hosts(contract.hosts)[contract.worker_index]
    # The start-up timeout: the contract's timeout is the peer timeout once the gang trains elastic.
    joined = join_round(
        contract.rendezvous_addr, contract.rendezvous_port, host, RENDEZVOUS_TIMEOUT_SECONDS, threading.Event(),
        member=os.environ.get(MEMBER_VARIABLE, ""), after=after,
    )  # fmt: skip
    assert joined is not None, "nothing stops this wait"
    os.environ.update(joined.rank_env(host.name, slot))
    return joined


def is_elastic() -> bool:
    """Whether the gang may run short (spec.workers.minReplicas below replicas): an elastic
    script's ranks then re-form; otherwise they form a fixed gang."""
    return current().contract.may_run_short


def _round() -> int:
    """The rendezvous round this process's ranks come from (its worker's, then its own joins)."""
    return int(os.environ.get(ROUND_VARIABLE) or 0)
