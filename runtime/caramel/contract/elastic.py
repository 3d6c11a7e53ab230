"""How a gang learns that its script trains elastic (Horovod's `hvd.elastic`).

Whether a job is elastic is the script's to say, not the spec's: a gang that may run short
(spec.workers.minReplicas below replicas) runs elastic once its script enters `hvd.elastic.run`,
whose rank 0 then says so in its log, once, in the line below (through the runtime, which puts
"caramel: " before it). Whoever runs the workers (`caramel
run`) reads it there: from then on a lost worker is no gang failure, its peers re-form without it
in their processes. An elastic script in a gang that may not run short runs as a fixed gang, and
its rank 0 says that instead.
"""

from __future__ import annotations

ELASTIC_MARK = "elastic gang of"


def elastic_notice(workers: int, min_workers: int) -> str:
    """Rank 0's line for a gang that runs elastic."""
    return (
        f"{ELASTIC_MARK} {workers} workers, down to {min_workers} (spec.workers.minReplicas): a lost worker's peers roll back "
        "to their last commit and go on without it; a worker that comes back joins at their next commit"
    )


def fixed_notice(workers: int) -> str:
    """Rank 0's line for an elastic script in a gang that may not run short."""
    return (
        f"the script trains elastic (hvd.elastic), but its gang of {workers} workers runs as a fixed gang: "
        "spec.workers.minReplicas is unset or equal to replicas; a lost worker restarts the whole gang"
    )


def says_elastic(line: str) -> bool:
    """Whether a log line is rank 0's word that its gang runs elastic."""
    return f"caramel: {ELASTIC_MARK} " in line
