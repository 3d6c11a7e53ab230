"""The labels that tie a job's objects to it: which job, which gang generation, which worker.

Their own module because both the builders and the gang schedulers (which point Kueue at the
worker index) name them, and the gang schedulers sit below the builders.
"""

JOB_LABEL = "caramel.dev/job"
WORKER_INDEX_LABEL = "caramel.dev/worker-index"
GANG_LABEL = "caramel.dev/gang"
