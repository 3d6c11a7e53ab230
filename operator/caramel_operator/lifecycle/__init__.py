"""The gang lifecycle as a pure state machine on status.phase.

`decide` takes what one pass observes (`Observed`: the job, its last status, its pods and own
objects, the time) and returns the pass (`Pass`): the new status, the actions that move the
cluster towards it, and the Events. It does no I/O, so every transition is unit-tested; the kopf
handlers only observe, call `decide`, and carry out the actions. What it cannot know from the
pods and the status (a gang scheduler's group object, R-Storm's placement from the cluster's
nodes and pods, rank 0's training figures) it asks for (`Pass.reads`): the handler reads exactly
that and calls `decide` again with it, which then decides from it.

    Pending --all workers running--> Running --all succeeded--> Succeeded
       |  \\                           |
       |   `--worker failed--> Restarting (backoff, new gang) --> Running ...
       |                               `--backoff limit reached--> Failed
       `--suspend--> Suspended --resume--> Pending

`decide` runs one module's steps after another (machine.py): the spec's validity and the run
policy (run_policy.py: suspend, resume, the deadline), the job's own objects (create.py), a
failed worker, an invalid image or a gang stuck partly scheduled (restart.py, with the failures
told in failures.py; an elastic gang going on without a worker, elastic.py), the gang's
placement (place.py) and admission (admit.py) before its pods are created (create.py), a gang
growing at a checkpoint (grow.py), its phase from its workers' states (advance.py), and rank 0's
figures while it runs (progress.py).

Every gang is placed before any of its pods exists: with R-Storm, `decide` asks for a placement
(`PlaceGang`), the handler reads the cluster and places the gang, and the second call records
the outcome in the status and goes on from it, creating the pods from the recorded placement:
one pass places and creates the gang. So every pod of a gang, even one re-created after an
operator restart, follows the same placement and gets the same topology.

A restart after a worker failed of itself waits a backoff that doubles at each such restart; one
after a worker was lost (observe.LOST_REASONS: its pod deleted or evicted, its node gone) starts
the new gang at once, as soon as the old pods are gone. Both count against backoffLimit. `due`
says when the status next asks for a pass (a backoff's end), so that the handler comes back then.
A gang whose every failed worker says its script raised before rank 0's first step is not
restarted: the job fails at once with reason ScriptError, quoting the error (the restart policy's
`fails_at_once`), unless spec.runPolicy.restartOnScriptError.

A gang may run with fewer workers than spec.workers.replicas, never fewer than minReplicas
(status.size). Each gang starts with at least `next_min_workers` (status.size.nextMinWorkers),
set when the gang before it ended: all of them for a new or resumed job; as many as the gang
before after a failure (R-Storm places more where they fit; the scheduler, which cannot tell
before, is asked for all of them); the survivors after workers were lost with their pods or
nodes; the scheduled ones when the rest stayed unschedulable for the gang scheduling timeout
(that restart is a resize: no backoff, not counted against backoffLimit). R-Storm places the most
workers that fit, from `next_min_workers` up, and once a gang has found no room for the gang scheduling timeout, from minReplicas up. While a gang
R-Storm placed runs short, the operator looks for room every gang scheduling timeout; room found,
the gang restarts with the larger size after rank 0's next checkpoint (another resize).
"""

from caramel_operator.lifecycle.actions import (
    EVENT_MESSAGE_BYTES,
    Action,
    CreateGroup,
    CreateObject,
    CreatePods,
    DeleteGroup,
    DeletePods,
    Event,
    PlaceGang,
    Read,
    ReadGroup,
    ReadProgress,
)
from caramel_operator.lifecycle.create import report_creation_failures
from caramel_operator.lifecycle.grow import record_room
from caramel_operator.lifecycle.machine import decide, due
from caramel_operator.lifecycle.observed import Observed
from caramel_operator.lifecycle.passes import Pass
from caramel_operator.lifecycle.place import record_placement
from caramel_operator.lifecycle.run_policy import expires_at, reject_invalid
from caramel_operator.lifecycle.status import FINISHED, parse_timestamp, status_from, timestamp

__all__ = [
    "EVENT_MESSAGE_BYTES",
    "FINISHED",
    "Action",
    "CreateGroup",
    "CreateObject",
    "CreatePods",
    "DeleteGroup",
    "DeletePods",
    "Event",
    "Observed",
    "Pass",
    "PlaceGang",
    "Read",
    "ReadGroup",
    "ReadProgress",
    "decide",
    "due",
    "expires_at",
    "parse_timestamp",
    "record_placement",
    "record_room",
    "reject_invalid",
    "report_creation_failures",
    "status_from",
    "timestamp",
]
