"""The trivial benchmark worker: Horovod allreduce bus bandwidth over the emulated links.

Horovod is plain Horovod over Gloo, imported past Caramel's own `horovod` package
(plain_horovod.py).

Started by the harness through Caramel's entrypoint; rank 0 prints one JSON line per timed
allreduce: {"event": "allreduce", "megabytes", "seconds", "bus_mbit_per_s"}. Bus bandwidth
is what each link carried: a ring allreduce of B bytes over n ranks sends 2 (n - 1) / n x B
per rank, so on links of rate R it approaches R.
"""

from __future__ import annotations

import argparse
import json
import time

import tensorflow as tf

from benchmarks.plain_horovod import horovod_tensorflow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    hvd = horovod_tensorflow()
    hvd.init()
    # Random values: a constant tensor could be folded away instead of communicated.
    tensor = tf.random.uniform([args.megabytes * 2**20 // 4], seed=hvd.rank())
    hvd.allreduce(tensor, op=hvd.Sum).numpy()  # warm-up: connections and buffers
    for _ in range(args.repeats):
        started = time.perf_counter()
        hvd.allreduce(tensor, op=hvd.Sum).numpy()
        seconds = time.perf_counter() - started
        if hvd.rank() == 0:
            bus_bytes = 2 * (hvd.size() - 1) / hvd.size() * tensor.shape[0] * 4
            print(json.dumps({"event": "allreduce", "megabytes": tensor.shape[0] * 4 / 1e6, "seconds": seconds,
                              "bus_mbit_per_s": bus_bytes * 8 / seconds / 1e6}), flush=True)


if __name__ == "__main__":
    main()
