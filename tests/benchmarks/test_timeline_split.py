"""The split of Horovod's timeline into phases (benchmarks/timeline_split.py), on a timeline
written as Horovod's timeline.cc writes one: a grouped allreduce of two pieces negotiated with
rank ticks, fused into one collective, then a collective whose negotiation the response cache
answered."""

from __future__ import annotations

import json

import pytest

from benchmarks import timeline_split


def events() -> list[dict]:
    meta = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "caramel_step_0/caramel_arms/indexed_case/caramel_transfer_0_float32_1of2"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "caramel_step_0/caramel_arms/indexed_case/caramel_transfer_0_float32_2of2"}},
        {"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "caramel_step_0/caramel_transfer_1_float32"}},
    ]

    def piece(pid: int) -> list[dict]:
        return [
            {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1000, "pid": pid},
            {"ph": "X", "name": "0", "ts": 1000, "pid": pid, "dur": 0},
            {"ph": "X", "name": "1", "ts": 4000, "pid": pid, "dur": 0},
            {"ph": "E", "ts": 5000, "pid": pid},  # every rank had it 4 ms after rank 0
            {"ph": "B", "name": "ALLREDUCE", "ts": 7000 + pid, "pid": pid},  # 2 ms behind another collective
            {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 7000 + pid, "pid": pid},
            {"ph": "E", "ts": 7500, "pid": pid},
            {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 7500, "pid": pid},
            {"ph": "E", "ts": 17500, "pid": pid},
            {"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 17500, "pid": pid},
            {"ph": "E", "ts": 18000, "pid": pid},
            {"ph": "E", "ts": 18000, "pid": pid},
        ]

    cached = [
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 19000, "pid": 3},
        {"ph": "E", "ts": 21000, "pid": 3},  # after the first ended: the link idles 3 ms, waiting for the ranks
        {"ph": "B", "name": "ALLREDUCE", "ts": 21000, "pid": 3},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 21000, "pid": 3},
        {"ph": "E", "ts": 25000, "pid": 3},
        {"ph": "E", "ts": 25000, "pid": 3},
    ]
    return meta + piece(1) + piece(2) + cached


def test_pieces_processed_together_are_one_collective_with_its_phases(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events()))
    first, second = timeline_split.collectives(timeline_split.read_timeline(path))
    assert (first.name, second.name) == ("caramel_transfer_0_float32", "caramel_transfer_1_float32")
    assert (first.negotiate, first.queued, first.copies, first.wire) == pytest.approx((0.004, 0.002 + 1e-6, 0.001 - 1e-6, 0.010))
    assert (second.negotiate, second.queued, second.copies, second.wire) == pytest.approx((0.002, 0.0, 0.0, 0.004))


def test_a_timeline_cut_off_mid_write_is_read_to_its_last_complete_reduction(tmp_path):
    path = tmp_path / "timeline.json"
    text = json.dumps(events())
    path.write_text(text[: text.rindex('{"ph": "E", "ts": 25000')].rstrip(", "))  # the last collective left open
    assert [run.name for run in timeline_split.collectives(timeline_split.read_timeline(path))] == ["caramel_transfer_0_float32"]


def test_report_and_bad_input(tmp_path, capsys):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events()))
    assert timeline_split.main([str(path), "--match", "caramel_transfer"]) == 0
    out = capsys.readouterr().out
    assert "caramel_transfer_0_float32" in out
    # The link idled 3 ms between the two, while the second waited for the ranks.
    assert "idle 0.003 s, of which 0.000 s with the next collective already negotiated (Horovod's hand-over) and 0.003 s" in out
    path.write_text("not json")
    assert timeline_split.main([str(path)]) == 2
    assert "is not a Horovod timeline" in capsys.readouterr().err
