"""TensorFlow's thread pools sized to this training process's share of its machine's CPUs.

TensorFlow gives every process a pool of threads per core it can be scheduled on; the training
processes sharing a machine (or a pod's CPU limit) then run many more threads than CPUs
(`caramel.contract.cpus` says why that costs, and the rule). `size_thread_pools` sets both pools
by that rule, once, before the backend starts TensorFlow (the pools cannot change after). A pool
that the job's environment sizes (TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS in spec.env) or
that the script sized before `init` keeps its size.
"""

from __future__ import annotations

import os

import tensorflow as tf

from caramel.contract.cpus import INTER_OP_VARIABLE, INTRA_OP_VARIABLE, machine_cpus, pool_sizes
from caramel.contract.env import WorkerContract


def size_thread_pools(contract: WorkerContract) -> str:
    """Size the pools the job and the script left to TensorFlow; returns what was done, for the log."""
    sizes = pool_sizes(machine_cpus(), contract.ranks_on_this_machine)
    threading = tf.config.threading
    pools = [
        ("intra-op", INTRA_OP_VARIABLE, threading.get_intra_op_parallelism_threads, threading.set_intra_op_parallelism_threads, sizes.intra_op),
        ("inter-op", INTER_OP_VARIABLE, threading.get_inter_op_parallelism_threads, threading.set_inter_op_parallelism_threads, sizes.inter_op),
    ]  # fmt: skip
    left = [(name, set_size, threads) for name, variable, get, set_size, threads in pools if not (os.environ.get(variable) or get())]
    if not left:
        return f"TensorFlow's thread pools as the job sized them ({INTRA_OP_VARIABLE}, {INTER_OP_VARIABLE} or the script)"
    try:
        for _, set_size, threads in left:
            set_size(threads)
    except RuntimeError:  # TensorFlow ran an op before init: its pools exist already
        return "TensorFlow started before Caramel's init: its thread pools keep TensorFlow's sizes (call init before any op)"
    sized = " and ".join(f"{threads} {name}" for name, _, threads in left)
    kept = "; the other pool as the job sized it" if len(left) < len(pools) else ""
    return f"TensorFlow's thread pools sized to this rank's share of the CPUs ({sizes.cpus:g} CPU(s), {sizes.ranks} rank(s) on this machine): {sized} thread(s){kept}"
