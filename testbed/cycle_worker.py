"""A training process for tests/test_cycle.py: Horovod restarted with a longer cycle between two
executions of `ctf.function`, and training going on after it. The cycle's share of the step is
raised so that the test's short steps choose the longest cycle. Prints the cycle in force and
whether every rank ended with the same weights.
"""

from __future__ import annotations

import json
import os

import horovod.tensorflow as hvd
import tensorflow as tf

import caramel.tensorflow as ctf
from caramel.tensorflow import cycle
from testbed.small_steps import train

STEPS_PER_EXECUTION = 4
EXECUTIONS = 5  # one-step executions until the first measured plan, then the restart, then more steps


def main() -> None:
    cycle.CYCLE_SHARE_OF_STEP = 1e3  # any measured step asks for the longest cycle
    ctf.init()
    model = train(EXECUTIONS, STEPS_PER_EXECUTION)
    checksum = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.trainable_variables])
    every_rank = hvd.allgather(tf.reshape(checksum, [1]), name="cycle_worker_checksum").numpy()
    report = {
        "cycle_ms": ctf.communicator().cycle.cycle_ms,
        "environment": os.environ.get("HOROVOD_CYCLE_TIME"),
        "same_weights": len(set(every_rank.tolist())) == 1,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
