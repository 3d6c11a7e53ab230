"""A training process's side of an elastic gang's rendezvous rounds (`caramel.launch.rendezvous`):
how its ranks re-form at the gang's rendezvous, in the process, instead of through Horovod's
driver (`horovodrun`, ssh and a host-discovery script).

A gang runs elastic where its script enters `hvd.elastic.run` and spec.workers.minReplicas is
below replicas (`caramel.contract.elastic`). Then:
- `meet`: the process joins the rendezvous's next round (the workers alive) and takes its ranks
  from it, where the runtime re-forms its collectives in the process (`Runtime.reform`);
- `restart_keeping(commit)` re-forms where the backend's ranks cannot in the process (the
  tensorflow backend: its collective executor and coordination service serve one cluster per
  process): it runs the training command again in this process (`os.execv`: the same process to
  its worker, which goes on relaying its output), which joins the next round as it starts
  (`join_when_ready`) and takes back its former self's last commit (`carried_commit`);
- `newcomers`: workers waiting at the rendezvous to join, which the ranks take in at their next
  commit (Horovod's `HostsUpdatedInterrupt`); `watch_for_broken_ranks`: where the ranks re-form by
  restarting, leave them as soon as they broke.

No TensorFlow here, as everywhere in launching: Caramel's `horovod.tensorflow.elastic` joins these
rounds to the runtime's re-forming.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

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

# How long a collective of an elastic gang on the horovod backend waits for a peer
# (HOROVOD_GLOO_TIMEOUT_SECONDS once it trains): Horovod's background threads exchange a message
# every cycle (1 ms) even while their scripts do something else, so a peer silent this long is gone. A lost peer fails the survivors'
# collectives at once where its connection drops, but one blocked on a peer that is itself waiting
# at the rendezvous learns it only so (measured: 190 s and more with the gang's start-up timeout).
PEER_TIMEOUT_SECONDS = 5
CARRIED_COMMIT_VARIABLE = "CARAMEL_CARRIED_COMMIT"
"""The file in which a training process that restarted to re-form finds its former self's last
commit (and when its ranks broke, for the log), read once and removed."""

_restarted_into: Round | None = None
"""The round this process joined, where it restarted to re-form (`join_when_ready`)."""


@dataclass(frozen=True)
class CarriedCommit:
    """The last commit of a training process's former self, which restarted to re-form."""

    commit: bytes
    seconds_since_broken: float
    """Since the former self's ranks broke: how long the re-forming took."""
    round: Round | None
    """The round the process joined as it started (`join_when_ready`)."""


def round_number() -> int:
    """The rendezvous round this process's ranks come from (its worker's, then its own joins)."""
    return int(os.environ.get(ROUND_VARIABLE) or 0)


def join_when_ready(on_horovod: Callable[[WorkerContract], bool]) -> None:
    """A training process that joins an elastic gang's ranks itself, once ready to train, before its
    backend starts: one of a worker that came back to the gang (JOIN_WHEN_READY) joins the open
    round, and one restarted to re-form (`restart_keeping`) the round after its former self's; each
    takes its ranks from the round joined, the first with the peer timeout where the job's backend
    is the horovod one (`on_horovod`). Where the gang finished meanwhile, there is nothing to do."""
    global _restarted_into
    restarted = CARRIED_COMMIT_VARIABLE in os.environ
    if os.environ.get(ROUND_VARIABLE) != JOIN_WHEN_READY and not restarted:
        return
    contract = WorkerContract.from_env()
    try:
        met = meet(contract, int(os.environ.get("HOROVOD_LOCAL_RANK") or 0), after=round_number() if restarted else -1)
    except GangFinished:
        print("caramel: the gang finished training before this worker rejoined it", file=sys.stderr, flush=True)
        sys.exit(0)
    if restarted:
        _restarted_into = met
    # Not on the tensorflow backend: its collectives keep the contract's timeout, since a peer
    # silent for seconds there is in a long computation (a lost one fails them at once).
    elif on_horovod(contract):
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(PEER_TIMEOUT_SECONDS)


def meet(contract: WorkerContract, slot: int, after: int) -> Round:
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


def newcomers(contract: WorkerContract) -> tuple[str, ...]:
    """Workers waiting at the rendezvous to join this elastic gang's ranks."""
    return waiting_to_join(contract.rendezvous_addr, contract.rendezvous_port, round_number())


def watch_for_broken_ranks(contract: WorkerContract, leave: Callable[[], None]) -> None:
    """Where the ranks re-form by restarting (`restart_keeping`), leave them (`leave`: the
    backend's) as soon as a worker of this process's round joins the next one, from a thread: its
    ranks broke (a peer was lost, or took one in). A survivor in the middle of a step's computation
    when the others failed would otherwise next wait on a restarted peer for a collective that no
    process of the new ranks runs, and TensorFlow's collectives have no peer timeout short enough
    (a peer's computation can take as long)."""
    address, port, number = contract.rendezvous_addr, contract.rendezvous_port, round_number()

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
                leave()
                return

    threading.Thread(target=watch, name="caramel-broken-ranks", daemon=True).start()


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
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def carried_commit() -> CarriedCommit | None:
    """The last commit of this process's former self, where it restarted to re-form (`restart_keeping`)."""
    path = os.environ.pop(CARRIED_COMMIT_VARIABLE, None)
    if path is None:
        return None
    with open(path, "rb") as kept:
        commit, broke_at = pickle.loads(kept.read())
    os.remove(path)
    return CarriedCommit(commit, time.time() - broke_at, _restarted_into)


__all__ = [  # Round too: `meet` and `CarriedCommit` hand it out
    "CARRIED_COMMIT_VARIABLE", "PEER_TIMEOUT_SECONDS", "CarriedCommit", "Round", "carried_commit", "join_when_ready", "meet",
    "newcomers", "restart_keeping", "round_number", "watch_for_broken_ranks",
]  # fmt: skip
