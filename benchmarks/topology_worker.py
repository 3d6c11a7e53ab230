"""The topology benchmark's worker: Horovod's ring and Caramel's MULTITREE on the same buffers.

Horovod is plain Horovod (its ops over Gloo), imported past Caramel's own `horovod` package
(plain_horovod.py): the ring measured is Horovod's, not Caramel's.

Started through Caramel's entrypoint like any worker; it reads the topology and the transport's
addresses from the worker contract. For each size, in every repeat, both algorithms all-reduce
the same random float32 buffer (which goes first alternates), each after a barrier; a run's
time is the slowest rank's. Rank 0 prints JSON lines:
  {"event": "allreduce", "algorithm", "megabytes", "repeat", "seconds"}
  {"event": "check", "megabytes", "max_difference"}   # between the two averages, once per size
"""

from __future__ import annotations

import argparse
import json
import time
from types import ModuleType

import numpy as np
import tensorflow as tf

from benchmarks.plain_horovod import horovod_tensorflow
from caramel.allreduce.multitree_schedule import multitree
from caramel.collectives.tree_transport import CONGESTION_CONTROL, PIECE_BYTES, TreeTransport
from caramel.contract.env import WorkerContract
from caramel.network.wire import job_topology

MEGABYTE = 2**20
WARM_UP_BYTES = MEGABYTE


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,16,64,128,256", help="buffer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--piece-bytes", type=int, default=PIECE_BYTES, help="the transport's piece size")
    parser.add_argument("--congestion-control", default=CONGESTION_CONTROL, help="the transport's; 'system': the default")
    args = parser.parse_args()
    hvd = horovod_tensorflow()
    hvd.init()
    contract = WorkerContract.from_env()
    schedule = multitree(job_topology(contract))
    transport = TreeTransport(
        schedule, hvd.rank(), contract.transport_addresses, piece_bytes=args.piece_bytes,
        congestion_control=None if args.congestion_control == "system" else args.congestion_control,
    )  # fmt: skip
    sequence = 0

    # Each algorithm gets the buffer in its own type, made before the clock starts: a tensor for
    # Horovod, a numpy array for the transport (getting one from the other is a copy), with an
    # output array it reuses, as a training loop can for gradients of fixed shapes.
    def ring(buffer: Buffer) -> np.ndarray:
        return hvd.allreduce(buffer.tensor, op=hvd.Average, name=f"buffer{buffer.array.size}").numpy()

    def tree(buffer: Buffer) -> np.ndarray:
        nonlocal sequence
        sequence += 1
        return transport.allreduce(buffer.array, sequence - 1, out=buffer.out)

    algorithms = {"ring": ring, "multitree": tree}
    for run in algorithms.values():  # connections, buffers and code paths, unmeasured
        run(Buffer(np.ones(WARM_UP_BYTES // 4, np.float32)))
    for megabytes in [int(size) for size in args.sizes.split(",")]:
        # Random values: a constant could be folded away instead of communicated.
        buffer = Buffer(np.random.default_rng(hvd.rank()).random(megabytes * MEGABYTE // 4, dtype=np.float32))
        for repeat in range(args.repeats):
            order = list(algorithms) if repeat % 2 == 0 else list(algorithms)[::-1]
            for name in order:
                hvd.allreduce(tf.zeros([1]), name="barrier")
                started = time.perf_counter()
                algorithms[name](buffer)
                seconds = hvd.allgather(tf.constant([time.perf_counter() - started], tf.float64)).numpy().max()
                report(hvd, {"event": "allreduce", "algorithm": name, "megabytes": megabytes, "repeat": repeat,
                             "seconds": float(seconds)})
        difference = np.abs(ring(buffer) - tree(buffer)).max()
        report(hvd, {"event": "check", "megabytes": megabytes, "max_difference": float(difference)})
    transport.close()


class Buffer:
    """One rank's buffer as a tensor and as an array, and an output array, all in memory already touched."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.tensor = tf.convert_to_tensor(array)
        self.out = array.copy()


def report(hvd: ModuleType, event: dict) -> None:
    if hvd.rank() == 0:
        print(json.dumps(event), flush=True)


if __name__ == "__main__":
    main()
