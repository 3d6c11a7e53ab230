"""Training command of the transport's end-to-end test: `multitree` against Horovod's allreduce.

Run by `caramel run JOB --topology FILE`; every rank builds the transport from the worker
contract, all-reduces the same buffers with Horovod (op Average) and with the transport, and
prints one JSON line per comparison. It exits 1 if any result differs beyond the dtype's tolerance.
Horovod takes no bfloat16: those buffers are compared with Horovod's average of them as float32.
"""

from __future__ import annotations

import json
import sys

import horovod.tensorflow as hvd
import ml_dtypes
import numpy as np
import tensorflow as tf

from caramel.allreduce.multitree_schedule import multitree
from caramel.collectives.tree_transport import TreeTransport
from caramel.contract.env import WorkerContract
from caramel.network.wire import job_topology

# The drop-ins' gradient dtypes, with a tolerance for sums taken in different orders.
TOLERANCES = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 2e-3,
              np.dtype(ml_dtypes.bfloat16): 2e-2}


def main() -> int:
    hvd.init()
    contract = WorkerContract.from_env()
    transport = TreeTransport(multitree(job_topology(contract)), contract.rank, contract.transport_addresses)
    rng = np.random.default_rng(contract.rank)
    sequence, failures = 0, 0
    for dtype, tolerance in TOLERANCES.items():
        for elements in (1, contract.world_size - 1, 1001, 100003):
            values = rng.standard_normal(elements).astype(dtype)
            reference = values.astype(np.float32) if dtype == np.dtype(ml_dtypes.bfloat16) else values
            horovod = hvd.allreduce(tf.constant(reference), op=hvd.Average, name=f"check{sequence}").numpy()
            tree = transport.allreduce(values, sequence)
            sequence += 1
            difference = float(np.max(np.abs(tree.astype(np.float64) - horovod.astype(np.float64)), initial=0.0))
            ok = difference <= tolerance * max(1.0, float(np.max(np.abs(horovod.astype(np.float64)), initial=0.0)))
            failures += not ok
            print(json.dumps({"dtype": dtype.name, "elements": elements, "max_difference": difference, "ok": ok}))
    transport.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
