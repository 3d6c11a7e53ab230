"""One step on one time axis (benchmarks/step_timeline.py): which layers a collective carries
when each gradient is computed from every later layer's backward kernel, when the next step
needed them, and where each step's time went, on a graph and a profile written by hand: two
steps of a two-layer model in one graph, one transfer per layer and step."""

from __future__ import annotations

import math

import pytest
from tensorflow.core.framework import graph_pb2

from benchmarks import step_timeline
from benchmarks.step_timeline import Span, Transfer


def graph(steps: int = 2) -> graph_pb2.GraphDef:
    """Per step: layer 1's backward kernel, then layer 0's (fed by it), each layer's gradient a
    product of its kernel's output, layer 0's sent alone and layer 1's through a concat."""
    graph_def = graph_pb2.GraphDef()

    def node(name: str, op: str, *inputs: str) -> None:
        added = graph_def.node.add(name=name, op=op)
        added.input.extend(inputs)

    for step in range(steps):
        copy = f"caramel_step_{step}/"
        node(f"{copy}layer_1_backward", "EagerPyFunc")
        node(f"{copy}layer_0_backward", "EagerPyFunc", f"{copy}layer_1_backward")
        node(f"{copy}gradient_1", "Mul", f"{copy}layer_1_backward")
        node(f"{copy}gradient_0", "Mul", f"{copy}layer_0_backward")
        node(f"{copy}joined", "ConcatV2", f"{copy}gradient_1", f"^{copy}gradient_0")
        node(f"{copy}transfer_1", "HorovodGroupedAllreduce", f"{copy}joined")
        node(f"{copy}transfer_0", "HorovodGroupedAllreduce", f"{copy}gradient_0")
    return graph_def


def spans() -> dict[str, list[Span]]:
    """In ms: step 0's forward 0-10, backward 10-30; layer 1's transfer 20-60 and layer 0's
    30-45; step 1's forward of layer 0 starts once layer 0's transfer ended (50), and that of
    layer 1 waits for its transfer (60); step 1's backward, then its transfers end at 120."""
    ms = 1e-3
    timeline = {
        "caramel_step_0/model/layer_0_forward": (0, 4),
        "caramel_step_0/model/layer_1_forward": (4, 10),
        "caramel_step_0/layer_1_backward": (10, 20),
        "caramel_step_0/layer_0_backward": (20, 30),
        "caramel_step_0/transfer_1": (20, 60),
        "caramel_step_0/transfer_0": (30, 45),
        "caramel_step_1/model/layer_0_forward": (50, 54),
        "caramel_step_1/model/layer_1_forward": (62, 68),
        "caramel_step_1/layer_1_backward": (68, 78),
        "caramel_step_1/layer_0_backward": (78, 88),
        "caramel_step_1/transfer_1": (78, 120),
        "caramel_step_1/transfer_0": (88, 100),
    }
    return {name: [Span(start * ms, end * ms)] for name, (start, end) in timeline.items()}


def found() -> list[Transfer]:
    return step_timeline.transfers([graph()], spans())


def test_a_collective_carries_the_lowest_layer_each_of_its_tensors_was_computed_from() -> None:
    layers = {(t.copy, t.name): t.layers for t in found()}
    assert layers == {
        ("caramel_step_0/", "transfer_1"): (1,),  # layer 0's gradient only orders the concat: not carried
        ("caramel_step_0/", "transfer_0"): (0,),  # its gradient descends from layer 1's kernel too
        ("caramel_step_1/", "transfer_1"): (1,),
        ("caramel_step_1/", "transfer_0"): (0,),
    }


def test_a_transfer_is_needed_when_the_next_steps_forward_kernel_of_its_first_layer_starts() -> None:
    needed = {(t.copy, t.name): t.needed for t in found()}
    assert needed[("caramel_step_0/", "transfer_0")] == pytest.approx(0.050)
    assert needed[("caramel_step_0/", "transfer_1")] == pytest.approx(0.062)
    assert math.isnan(needed[("caramel_step_1/", "transfer_0")])  # the next step is in the next execution


def test_each_steps_time_is_its_kernels_its_waits_for_parameters_its_boundary_and_the_host() -> None:
    first, last = step_timeline.step_budgets(found(), spans())
    assert (first.copy, last.copy) == ("caramel_step_0/", "caramel_step_1/")
    # step 0 runs to step 1's first forward kernel: 30 ms of kernels, then layer 0's transfer to 45
    # (a wait for parameters) and 5 ms of host before the kernel starts
    assert first.seconds == pytest.approx(0.050)
    assert (first.forward, first.backward) == (pytest.approx(0.010), pytest.approx(0.020))
    assert (first.parameter_wait, first.boundary, first.host) == (pytest.approx(0.015), 0.0, pytest.approx(0.005))
    assert first.link_busy == pytest.approx(0.030)  # 20-60, cut at the step's end (50)
    # step 1: layer 1's forward kernel waited 54-60 for its transfer, then 2 ms of host; after its
    # backward pass, the execution's boundary until its last transfer ended
    assert last.seconds == pytest.approx(0.070)
    assert (last.parameter_wait, last.host, last.boundary) == (pytest.approx(0.006), pytest.approx(0.002), pytest.approx(0.032))
    assert last.link_busy == pytest.approx(0.052)  # 50-60 of step 0's transfer, then 78-120
    for budget in (first, last):
        assert budget.forward + budget.backward + budget.parameter_wait + budget.boundary + budget.host == pytest.approx(budget.seconds)


def test_the_report_prints_the_needed_column_and_the_mean_step() -> None:
    text = step_timeline.report(found(), spans())
    assert "needed" in text and "where the time went" in text
    mean = next(line for line in text.splitlines() if line.strip().startswith("mean step"))
    assert mean.split()[2:5] == ["60.0", "10.0", "20.0"]  # the two steps' 50 and 70 ms; 10 and 20 ms of kernels each
