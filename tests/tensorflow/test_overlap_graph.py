"""Overlap is the floor: in the graph TensorFlow runs, every collective that carries gradients waits
for no gradient released after its own (the per-step paths, and the backend's own way in Caramel's
graph of several steps: on Horovod's collectives for its own gradients and nothing else; on
TensorFlow's also for the collectives traced before it, whose gradients came earlier, as their
ordering token chains them), or, for the plan's transfers, for no gradient released after those
of the transfers up to it in the plan's order. A collective that waited for more (a functional op over
every gradient, a stamp, the selector's tick, a stateful op chained before it) would start only
once the backward pass is over: the step would be compute plus communication.

The graphs are the optimized partition graphs of real ranks (testbed/overlap_graph_worker.py): on
each backend, for the per-step tf.function with Caramel's tape and for `ctf.function` with the plan
the runtime makes and with a plan of one transfer per layer; on the horovod backend, for an
unchanged Horovod script's tape."""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import job_manifest, run_caramel, write_manifest
from testbed.lab import lab_variables

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
PLANS = {
    "planned": ({}, {}),
    # Tensors kept whole in transfers of at most one layer: one transfer per layer, in the plan's order.
    "a-transfer-per-layer": ({"minBucketBytes": 4 * MiB, "maxBucketBytes": 4 * MiB}, {"batching": "fixed"}),
}
TRANSFER = re.compile(r"caramel_transfer_(\d+)")


def report(tmp_path, api: str, backend: str, caramel: dict | None = None, lab: dict | None = None, unshaped: tuple[int, ...] = ()) -> list[list[dict]]:
    output = tmp_path / "collectives.json"
    command = [sys.executable, "-m", "testbed.overlap_graph_worker", "--api", api, "--output", str(output)]
    if unshaped:
        command += ["--unshaped", *map(str, unshaped)]
    env = [{"name": name, "value": value} for name, value in lab_variables(**lab).items()] if lab else []
    manifest = job_manifest(script=None, command=command, args=[], caramel={"backend": backend, **(caramel or {})}, env=env)
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)))
    assert result.returncode == 0, result.stderr
    return json.loads(output.read_text())["graphs"]


def gradient_collectives(graphs: list[list[dict]]) -> list[dict]:
    return [collective for graph in graphs for collective in graph if collective["carried"]]


def waits_for_its_own_only(collective: dict, backend: str) -> bool:
    """Its own gradients and nothing else on Horovod's collectives; on TensorFlow's, nothing
    released after them (layers are released last first: a lower layer comes later)."""
    if backend == "horovod":
        return collective["waits"] == collective["carried"]
    return min(collective["waits"]) >= min(collective["carried"])


# What a backend's collectives wait for is the backend's: Caramel's tape shows it on both. Horovod's
# tape as Caramel serves it is that tape behind Horovod's API, run on the backend its scripts get.
@pytest.mark.parametrize(("api", "backend"), [("per-step", "horovod"), ("per-step", "tensorflow"), ("hvd-script", "horovod")])
def test_a_per_step_functions_collectives_wait_for_their_own_gradients_only(tmp_path, api, backend):
    collectives = gradient_collectives(report(tmp_path, api, backend))
    assert collectives
    carried = sorted(layer for collective in collectives for layer in collective["carried"])
    assert carried == sorted(set(carried)) == list(range(6)), "every layer's gradient in one collective"
    for collective in collectives:
        assert waits_for_its_own_only(collective, backend), collective


@pytest.mark.parametrize("backend", ["horovod", "tensorflow"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_caramels_collectives_wait_for_no_gradient_released_after_their_own_and_those_sent_before(tmp_path, backend, plan):
    caramel, lab = PLANS[plan]
    graphs = report(tmp_path, "function", backend, caramel, lab)
    several = [graph for graph in graphs if any(c["name"].startswith("caramel_step_3/") for c in graph)]
    assert several, "the run reached Caramel's graph of several steps"
    transfers_seen = 0
    for graph in graphs:
        planned: dict[tuple[str, int], dict] = {}
        for collective in gradient_collectives([graph]):
            match = TRANSFER.search(collective["name"])
            if match is None:  # the backend's own way, or a per-step graph: its own gradients only
                assert waits_for_its_own_only(collective, backend), collective
            else:
                copy = collective["name"].split("/", 1)[0] if collective["name"].startswith("caramel_step_") else ""
                planned[(copy, int(match.group(1)))] = collective
        transfers_seen += len(planned)
        for (copy, position), collective in planned.items():
            sent_before = {layer for (other, earlier), c in planned.items() if other == copy and earlier <= position for layer in c["carried"]}
            assert set(collective["waits"]) <= sent_before, collective
    assert transfers_seen
    if plan == "a-transfer-per-layer":
        assert any(len(c["carried"]) == 1 for c in gradient_collectives(several) if TRANSFER.search(c["name"]))


@pytest.mark.parametrize(("api", "backend"), [("per-step", "horovod"), ("per-step", "tensorflow"), ("function", "horovod"), ("function", "tensorflow")])
def test_a_gradient_of_no_static_shape_travels_on_its_own_and_holds_back_no_other(tmp_path, api, backend):
    """Layer 2's gradient has no static shape (a py_function's without set_shape): it goes in a
    collective of its own, and no collective of another gradient waits for it."""
    graphs = report(tmp_path, api, backend, unshaped=(2,))
    if api == "function":
        assert any(c["name"].startswith("caramel_step_3/") for graph in graphs for c in graph), "the run reached Caramel's graph of several steps"
    collectives = gradient_collectives(graphs)
    apart = [collective for collective in collectives if 2 in collective["carried"]]
    assert apart and all(collective["carried"] == [2] for collective in apart), apart
    others = [collective for collective in collectives if 2 not in collective["carried"]]
    assert sorted({layer for collective in others for layer in collective["carried"]}) == [0, 1, 3, 4, 5]
    for collective in others:
        assert 2 not in collective["waits"], collective
