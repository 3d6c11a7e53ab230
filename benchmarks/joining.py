"""How a benchmark worker joins its job's ranks, as a user of each strategy's API does.

    caramel                 `ctf.init()`; a measured run stands for a long training's steady state
                            (the policy's `long_training`) unless it is a whole job
    hvd-script              `hvd.init()` of the `horovod.tensorflow` the script imports: Caramel's
    horovod, comm-only      plain Horovod's `hvd.init()`
    mwms, comm-only-tf      a MultiWorkerMirroredStrategy from the worker contract
    compute-only            nothing to join

Caramel's two (CARAMEL_WORKERS) plan with the run's lab settings (testbed/lab.py: an anchor's or
ablation's policy, and whether the first plan's search is waited for), given before they join.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from types import ModuleType

import tensorflow as tf

import caramel.tensorflow as ctf
from benchmarks import mwms
from benchmarks.plain_horovod import caramels_horovod_tensorflow, horovod_tensorflow
from benchmarks.workloads import CARAMEL_WORKERS
from caramel.tensorflow.runtime import plan_with
from testbed.lab import lab_policy


@dataclass(frozen=True)
class Joined:
    """A worker's way into its job: plain Horovod's module or MWMS's strategy, where the strategy uses one."""

    strategy: str
    hvd: ModuleType | None = None
    mwms_strategy: tf.distribute.Strategy | None = None

    def scope(self) -> contextlib.AbstractContextManager:
        """Where the model and optimizer are made: MWMS's scope for mwms, no scope otherwise."""
        if self.strategy == "mwms" and self.mwms_strategy is not None:
            return self.mwms_strategy.scope()
        return contextlib.nullcontext()


def join(strategy: str, whole_job: bool) -> Joined:
    """Join the job's ranks the strategy's way (see the module's table), every strategy on the
    same thread pools."""
    # One thread per op and two ops at once, whatever the machine, for every strategy alike:
    # Caramel's workers size the pools a script leaves to TensorFlow (caramel.contract.cpus),
    # plain Horovod and MWMS leave TensorFlow's own, and the zoo compares strategies, not pools.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    if strategy in CARAMEL_WORKERS:
        plan_with(replace(lab_policy(), long_training=strategy == "caramel" and not whole_job))
    if strategy in ("horovod", "comm-only"):
        hvd = horovod_tensorflow()
        hvd.init()
        return Joined(strategy, hvd=hvd)
    if strategy == "hvd-script":
        hvd = caramels_horovod_tensorflow()
        hvd.init()
        return Joined(strategy, hvd=hvd)
    if strategy in ("mwms", "comm-only-tf"):
        return Joined(strategy, mwms_strategy=mwms.strategy())
    if strategy == "caramel":
        ctf.init()  # joins the job's ranks on its backend and makes the communicator from the worker contract
    return Joined(strategy)
