"""The split of Horovod's timeline into phases (benchmarks/timeline_split.py), on a timeline
written as Horovod's timeline.cc writes one: a negotiated reduction, then a cached one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import timeline_split


def events() -> list[dict]:
    meta = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "caramel_transfer_0_float32"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "caramel_transfer_1_float32"}},
    ]
    negotiated = [
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1000, "pid": 1},
        {"ph": "X", "name": "0", "ts": 1000, "pid": 1, "dur": 0},
        {"ph": "X", "name": "1", "ts": 4000, "pid": 1, "dur": 0},  # rank 1 is 3 ms late
        {"ph": "E", "ts": 5000, "pid": 1},  # the coordinator answers 1 ms later
        {"ph": "B", "name": "ALLREDUCE", "ts": 7000, "pid": 1},  # 2 ms behind another collective
        {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 7000, "pid": 1},
        {"ph": "E", "ts": 7500, "pid": 1},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 7500, "pid": 1},
        {"ph": "E", "ts": 17500, "pid": 1},
        {"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 17500, "pid": 1},
        {"ph": "E", "ts": 18000, "pid": 1},
        {"ph": "E", "ts": 18000, "pid": 1},
    ]
    cached = [
        {"ph": "B", "name": "ALLREDUCE", "ts": 21000, "pid": 2},  # the link idle 3 ms
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 21000, "pid": 2},
        {"ph": "E", "ts": 25000, "pid": 2},
        {"ph": "E", "ts": 25000, "pid": 2},
    ]
    return meta + negotiated + cached


def test_phases_of_a_negotiated_and_a_cached_reduction(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events()))
    first, second = timeline_split.phases(timeline_split.read_timeline(path))
    assert first[0].name == "caramel_transfer_0_float32"
    assert dataclasses.astuple(first[1]) == pytest.approx((0.003, 0.001, 0.002, 0.001, 0.010, 0.0))  # skew respond queued copies wire gap
    skew, respond, queued, copies, wire, gap = dataclasses.astuple(second[1])
    assert (skew, respond, queued, copies) == (None, None, None, 0.0) and (wire, gap) == pytest.approx((0.004, 0.003))


def test_a_timeline_cut_off_mid_write_is_read_to_its_last_complete_reduction(tmp_path):
    path = tmp_path / "timeline.json"
    text = json.dumps(events())
    path.write_text(text[: text.rindex('{"ph": "E", "ts": 25000')].rstrip(", "))  # the cached reduction left open
    assert [reduction.name for reduction in timeline_split.read_timeline(path)] == ["caramel_transfer_0_float32"]


def test_report_and_bad_input(tmp_path, capsys):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events()))
    assert timeline_split.main([str(path), "--match", "caramel_transfer"]) == 0
    out = capsys.readouterr().out
    assert "caramel_transfer_0_float32" in out and "idle 0.003 s between reductions, of which 0.000 s" in out
    path.write_text("not json")
    assert timeline_split.main([str(path)]) == 2
    assert "is not a Horovod timeline" in capsys.readouterr().err
