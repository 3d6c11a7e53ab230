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
"""

from __future__ import annotations

from dataclasses import dataclass

from caramel.contract.api import CaramelJob

LOCAL_FIRST_BACKOFF_SECONDS = 1.0
LOCAL_MAX_BACKOFF_SECONDS = 30.0


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

    @classmethod
    def of(
        cls,
        job: CaramelJob,
        first_backoff_seconds: float = LOCAL_FIRST_BACKOFF_SECONDS,
        max_backoff_seconds: float = LOCAL_MAX_BACKOFF_SECONDS,
    ) -> RestartPolicy:
        run_policy = job.spec.run_policy
        return cls(run_policy.backoff_limit, run_policy.active_deadline_seconds, first_backoff_seconds, max_backoff_seconds)

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
