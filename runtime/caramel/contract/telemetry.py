"""The Prometheus series a training process serves and the operator reads.

Every training process serves its own metrics (`caramel.metrics`, on CARAMEL_METRICS_PORT), each
series labelled with its rank. The operator scrapes rank 0's for the job's status
(`caramel_operator.progress`): the series named here are that part of the contract, for progress
(step, step time, loss, bandwidth, latest checkpoint, whether the gang trains elastic) and for tuning (the plan's bucket size and
the fitted link), which a restarted gang starts from (CARAMEL_TUNING).
"""

from __future__ import annotations

RANK_LABEL = "rank"
"""The label that tells the ranks' series apart."""

# Progress.
STEP_DURATION = "caramel_step_duration_seconds"
"""A histogram: its _sum and _count between two scrapes give the mean step in between."""
GLOBAL_STEP = "caramel_global_step"
CHECKPOINT_STEP = "caramel_checkpoint_step"
BANDWIDTH = "caramel_bandwidth_bytes_per_second"
LOSS = "caramel_loss"
ELASTIC = "caramel_elastic"
"""1 once rank 0's gang trains elastic (Horovod's hvd.elastic, spec.workers.minReplicas below
replicas: `caramel.contract.elastic`): the operator then replaces a lost worker instead of
restarting the gang."""

# Tuning.
BUCKET_BYTES = "caramel_batching_bucket_bytes"
LINK_ALPHA = "caramel_link_alpha_seconds"
LINK_BETA = "caramel_link_beta_seconds_per_byte"
