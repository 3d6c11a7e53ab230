"""When a failed gang restarts, how long it waits first, and when a job gives up: one policy for
`caramel run` and the operator.

A worker that fails fails its whole gang, which restarts whole (a job with spec.checkpoint
resumes from its latest checkpoint) after a backoff that doubles at each restart, from a first
wait up to a longest: 1 s to 30 s under `caramel run`, the operator's settings in a cluster
(CARAMEL_RESTART_BACKOFF_SECONDS and CARAMEL_RESTART_BACKOFF_MAX_SECONDS, 10 s to 300 s unless
set). In a cluster, a gang whose worker was lost (its pod deleted or evicted, its node gone)
restarts at once: that is no crash loop to slow down, and the wait doubles only at restarts that
waited. After spec.runPolicy.backoffLimit restarts, lost workers' included, the next failure
fails the job, and so does running longer than spec.runPolicy.activeDeadlineSeconds.

A script's own bug is no reason to restart: a gang whose every failed worker says its rank's
script raised (`caramel.contract.termination.ScriptRaised`: an exception of the script's, not a
kill, not a peer's failure, not a lost worker) before rank 0's first step fails the job at once
(`fails_at_once`), as a JobSet failure-policy rule can fail a job on a container's exit code: the
same script would raise the same way at every restart. spec.runPolicy.restartOnScriptError: true
restarts it as any other failure (a script that reads something not there yet, say). After any
step, a raise restarts as before: the step may be what went wrong (bad data), and a checkpoint
resumes past it.

Only rank 0's worker knows whether a step was done (rank 0 alone reports progress). A judge that
sees rank 0's progress itself (`caramel run`) says so; one that does not (the operator) waits up to
SCRIPT_ERROR_WAIT_SECONDS after the first failure for rank 0's worker to end and say so, where it
still runs (`awaits_rank_0`): when every rank raises the same error, they do within moments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caramel.contract.api import CaramelJob
from caramel.contract.termination import ScriptRaised

LOCAL_FIRST_BACKOFF_SECONDS = 1.0
LOCAL_MAX_BACKOFF_SECONDS = 30.0
SCRIPT_ERROR_WAIT_SECONDS = 5.0
"""How long after a script error the operator waits for rank 0's worker to say whether it did a step."""
SCRIPT_ERROR = "ScriptError"
"""The reason of a job failed at once for its script's error (`fails_at_once`)."""
NOT_RESTARTED = (
    "the script raised before rank 0's first step, as it would at every restart: the job fails without restarting "
    "(spec.runPolicy.restartOnScriptError: true restarts it)"
)
"""What follows the error quoted, for a job failed at once."""


@dataclass(frozen=True)
class RestartPolicy:
    backoff_limit: int
    """Restarts after failures before the next failure fails the job (spec.runPolicy.backoffLimit)."""
    active_deadline_seconds: int | None
    """How long the job may run, restarts included (spec.runPolicy.activeDeadlineSeconds)."""
    first_backoff_seconds: float
    """The wait before the first restart."""
    max_backoff_seconds: float
    """The longest wait before a restart."""
    restart_on_script_error: bool = False
    """Restart a gang whose script raised before its first step, as any other (spec.runPolicy.restartOnScriptError)."""

    @classmethod
    def of(
        cls,
        job: CaramelJob,
        first_backoff_seconds: float = LOCAL_FIRST_BACKOFF_SECONDS,
        max_backoff_seconds: float = LOCAL_MAX_BACKOFF_SECONDS,
    ) -> RestartPolicy:
        run_policy = job.spec.run_policy
        return cls(
            run_policy.backoff_limit,
            run_policy.active_deadline_seconds,
            first_backoff_seconds,
            max_backoff_seconds,
            run_policy.restart_on_script_error,
        )

    def may_restart(self, restarts_so_far: int) -> bool:
        """Whether a failure after `restarts_so_far` restarts restarts the gang (else the job fails)."""
        return restarts_so_far < self.backoff_limit

    def backoff(self, waited_so_far: int) -> float:
        """Seconds to wait before a restart that follows `waited_so_far` restarts that waited."""
        return min(self.max_backoff_seconds, self.first_backoff_seconds * 2.0**waited_so_far)

    def deadline_passed(self, seconds_running: float) -> bool:
        """Whether a job that has run this long has run out of spec.runPolicy.activeDeadlineSeconds."""
        if not self.active_deadline_seconds:
            return False
        return seconds_running >= self.active_deadline_seconds

    def fails_at_once(self, raised: Sequence[ScriptRaised | None], no_step_seen: bool = False) -> bool:
        """Whether a gang's failure fails the job at once instead of restarting it. `raised`: what
        each failed worker said of its script (None for a worker that failed otherwise: lost,
        killed, a peer's failure, no summary); `no_step_seen`: the judge saw rank 0 report no
        step itself. Every failed worker's script raised, and rank 0 had done no step."""
        if self.restart_on_script_error or not raised or None in raised:
            return False
        return no_step_seen or any(said is not None and said.before_first_step for said in raised)

    def awaits_rank_0(self, raised: Sequence[ScriptRaised | None], rank_0_runs: bool, seconds_since_failure: float) -> bool:
        """Whether to hold a gang's restart for rank 0's worker, which still runs, to end and say
        whether rank 0 did a step: where its word could fail the job at once (every failed worker
        so far says its script raised), for SCRIPT_ERROR_WAIT_SECONDS after the first failure."""
        if self.restart_on_script_error or not rank_0_runs or not raised or None in raised:
            return False
        return seconds_since_failure < SCRIPT_ERROR_WAIT_SECONDS
