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
- `newcomers()`: workers waiting at the rendezvous to join, which the ranks take in at their next
  `commit()` (Horovod's `HostsUpdatedInterrupt`).
Only the horovod backend re-forms in the process; on the tensorflow backend elastic training is
refused, naming it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf

from caramel.contract.elastic import elastic_notice, fixed_notice
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, WorkerContract
from caramel.launch.rendezvous import (
    JOIN_WHEN_READY,
    MEMBER_VARIABLE,
    ROUND_VARIABLE,
    GangFinished,
    Round,
    join_round,
    parse_hosts,
    waiting_to_join,
)
from caramel.tensorflow.runtime import current
from horovod.tensorflow import _caramel_final_check

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


# How long a collective of an elastic gang waits for a peer (HOROVOD_GLOO_TIMEOUT_SECONDS once it
# trains): Horovod's background threads exchange a message every cycle (1 ms) even while their
# scripts do something else, so a peer silent this long is gone. A lost peer fails the survivors'
# collectives at once where its connection drops, but one blocked on a peer that is itself waiting
# at the rendezvous learns it only so (measured: 190 s and more with the gang's start-up timeout).
PEER_TIMEOUT_SECONDS = 5

_said = False


def enter() -> bool:
    """Whether the gang runs elastic, checked where a script enters `hvd.elastic.run`: refused with
    Caramel's own TrainingRun and on a backend that cannot re-form; rank 0 says which, once."""
    global _said
    runtime = current()
    runtime.drive(
        "hvd.elastic.run",
        "TrainingRun rolls back to its checkpoint, restarting the whole gang; train either with hvd.elastic "
        "(its ranks re-form in the process, from the last commit) or with TrainingRun",
    )
    workers = runtime.contract.full_world_size // runtime.contract.slots_per_worker
    elastic = is_elastic()
    if elastic:
        runtime.check_reforms()
        runtime.metrics.record_elastic()  # the operator then replaces a lost worker instead of restarting the gang
        if not _said and _round() == 0:
            # The gang formed with the start-up timeout; every rank enters here at once, and forms
            # the same ranks again with the peer timeout, without the rendezvous.
            os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(PEER_TIMEOUT_SECONDS)
            runtime.reform(lambda: None)
            _caramel_final_check.rearm()
    if not _said:
        runtime.say(elastic_notice(workers, runtime.contract.min_workers) if elastic else fixed_notice(workers))
        _said = True
    return elastic


@contextmanager
def lost_peers_raised() -> Iterator[None]:
    """A collective that failed because a peer was lost raised as Horovod's HorovodInternalError.
    Horovod's ops fail so with Gloo's error (a read error, a connection reset by peer), or with
    Horovod's own once its background loop stopped on it: the message names Gloo or Horovod."""
    try:
        yield
    except tf.errors.OpError as error:
        if any(name in (error.message or "").lower() for name in ("gloo", "horovod")):
            # Leave the broken ranks now, not once the failed step is freed (a Keras fit's data
            # iterator can take seconds): a peer blocked on this rank fails at once instead of
            # after the peer timeout.
            backend = current().backend
            if backend.reforms:
                backend.leave()
            raise HorovodInternalError(error) from error
        raise


def join_when_ready() -> None:
    """A training process of a worker that came back to an elastic gang (JOIN_WHEN_READY): join
    the open round now that it is ready, taking its ranks from it, with the peer timeout; where
    the gang finished meanwhile, there is nothing to do."""
    if os.environ.get(ROUND_VARIABLE) != JOIN_WHEN_READY:
        return
    contract = WorkerContract.from_env()
    try:
        _meet(contract, int(os.environ.get("HOROVOD_LOCAL_RANK") or 0), after=-1)
    except GangFinished:
        print("caramel: the gang finished training before this worker rejoined it", file=sys.stderr, flush=True)
        sys.exit(0)
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
