"""One training process's part in the job: what `caramel.tensorflow.init()` returns.

The runtime holds what every part of Caramel's TensorFlow side works with: the job's env contract,
the collective backend, the gradient communicator (the replanner, the arm selector and the graph
choice) and the process's metrics. It is made once per process; the public entry points (the
drop-ins, `caramel.tensorflow.function`, `TrainingRun`, the Keras callback, Horovod's API as
Caramel serves it) find it with `current()` and hand it to everything below them.

Its communicators plan and send the gradients by Caramel's own policy, unless the process's
training script gave another before it joined (`plan_with`): the one seam through which the
benchmarks and tests run another method's piece of scheduling (testbed/lab.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from caramel.collectives.backend import Backend, chosen, set_up
from caramel.contract.env import WorkerContract
from caramel.metrics import WorkerMetrics
from caramel.planner.policy import PlanningPolicy
from caramel.tensorflow import stopping
from caramel.tensorflow.devices import training_device
from caramel.tensorflow.communicator import GradientCommunicator
from caramel.tensorflow.keras_version import keras_2
from caramel.tensorflow.unsupported import refuse


@dataclass
class Runtime:
    contract: WorkerContract
    backend: Backend
    communicator: GradientCommunicator
    metrics: WorkerMetrics
    local_variables: dict[int, Any] = field(default_factory=dict)
    """Variables each rank trains on its own gradients (Horovod's local sources), by id: the check
    that every rank ends with the same weights leaves them out."""
    driver: str = ""
    """What drives the training loop, where one claimed it (`drive`): Caramel's own `TrainingRun`
    or Horovod's `hvd.elastic.run`, which cannot share a process."""

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def size(self) -> int:
        return self.backend.size

    def drive(self, driver: str, instead: str) -> None:
        """Claim the training loop for `driver` (one of the two above). Each rolls the weights back
        its own way (TrainingRun to its checkpoint, a whole gang restarted; hvd.elastic to its
        last commit, in the process), so a script uses one: where the other claimed it first, this
        is refused, `instead` saying what to do."""
        if self.driver and self.driver != driver:
            refuse(f"{driver} in a script that uses {self.driver}", instead)
        self.driver = driver

    def reform(self, meet: Callable[[], None]) -> None:
        """Join the job's ranks anew in this process, as an elastic gang re-forms (Horovod's API as
        Caramel serves it: `hvd.elastic`): the backend leaves the old ranks at once (so that peers
        blocked on this one fail too, and meet again), `meet()` sets the new ranks' HOROVOD_*
        variables in the environment, and the backend joins them; the gradient communicator is
        made anew, since its plans, measurements, arm selection and graph choice were of the old
        world. Functions traced before keep their graphs: their collectives are the backend's ops,
        which take the world's size when they run (never MULTITREE's trees, built for one set of
        ranks: `GradientCommunicator` takes the ring where the ranks may re-form). The new contract's
        topology is that of the round's workers. Only for a backend whose `reforms` is true."""
        self.backend.leave()
        meet()
        self.contract = WorkerContract.from_env()
        self.backend = self.backend.reform(self.contract)
        self.communicator = GradientCommunicator(self.contract, self.backend, _policy)

    def say(self, message: str) -> None:
        """A line for people, from rank 0 only."""
        if self.rank == 0:
            print(f"caramel: {message}", file=sys.stderr, flush=True)


_runtime: Runtime | None = None
_policy = PlanningPolicy()


def plan_with(policy: PlanningPolicy) -> None:
    """For benchmarks and tests only (no job chooses one: `caramel.planner.policy`): plan and send
    this process's gradients by `policy` instead of Caramel's own. Before `init()`, whose
    communicator is built with it."""
    global _policy
    if _runtime is not None:
        raise RuntimeError("plan_with comes before caramel.tensorflow.init() (or hvd.init()): the communicator is built with the policy")
    _policy = policy


def init() -> Runtime:
    """Join the job's ranks (once per process; later calls return the same runtime)."""
    global _runtime
    if _runtime is None:
        contract = WorkerContract.from_env()
        # Before the backend, which starts TensorFlow: its devices are set only until then.
        device = training_device(contract)
        backend = set_up(chosen(contract), contract)
        # After the backend: TensorFlow's coordination service takes SIGTERM for itself as it starts.
        stopping.install()
        metrics = WorkerMetrics(backend.rank)
        if contract.metrics_port:
            metrics.serve(contract.metrics_port)
        _runtime = Runtime(contract, backend, GradientCommunicator(contract, backend, _policy), metrics)
        keras = "Keras 2 (tf-keras, TF_USE_LEGACY_KERAS)" if keras_2() else "Keras 3"
        _runtime.say(f"{backend.size} ranks on the {backend.name} backend (spec.caramel.backend: {contract.scheduling.backend.value}); tf.keras is {keras}")
        if contract.gpus_per_worker:
            _runtime.say(f"rank 0 trains on {device}; gradients on the GPU go over {backend.gpu_transport}")
        elif device:
            _runtime.say(device)
    return _runtime


def current() -> Runtime:
    """The process's runtime; `caramel.tensorflow.init()` (or Horovod's `hvd.init()`) makes it."""
    if _runtime is None:
        raise RuntimeError("call caramel.tensorflow.init() (or hvd.init() in a Horovod script) first")
    return _runtime
