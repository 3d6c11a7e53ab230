"""The zoo benchmark's arguments, table and summary, from made-up runs (its runs need root's
emulated cluster and hours of workers: `make bench-zoo`)."""

from __future__ import annotations

import pytest

from benchmarks import zoo_bench
from benchmarks.profiles import NAMES, TUNED, ZOO
from benchmarks.scheduling_bench import Cell, Point, Run
from benchmarks.workloads import make_workloads


def parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        zoo_bench.parse_args(list(argv))
    return capsys.readouterr().err


def test_the_zoo_is_broad_and_every_profile_has_a_regime() -> None:
    assert len(ZOO) >= 13 and len(NAMES) >= 15 and not set(TUNED) & set(ZOO)
    assert set(zoo_bench.REGIMES) == set(NAMES)
    assert {"many tiny tensors", "few huge tensors", "giant embedding", "deep residual", "vision transformer"} <= set(zoo_bench.REGIMES.values())


def test_defaults_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    args = zoo_bench.parse_args([])
    assert args.profile_names == list(NAMES) and args.rate_list == [1000.0, 4000.0] and args.repeats == 3
    assert args.strategy_names[0] == zoo_bench.BASELINE
    assert "--profiles: unknown lenet" in parse_error(capsys, "--profiles", "lenet")
    assert "--strategies: unknown nccl" in parse_error(capsys, "--strategies", "nccl")
    assert "--rates: expected comma-separated Mbit/s" in parse_error(capsys, "--rates", "fast")
    assert "--repeats: must be at least 1, got 0" in parse_error(capsys, "--repeats", "0")
    assert "--job-steps: must be at least 1, got 0" in parse_error(capsys, "--job-steps", "0")
    assert "--worker-env: expected NAME=VALUE" in parse_error(capsys, "--worker-env", "HOROVOD_TIMELINE")
    assert zoo_bench.parse_args(["--worker-env", "HOROVOD_TIMELINE=/tmp/t.json"]).worker_env == [("HOROVOD_TIMELINE", "/tmp/t.json")]


def run(seconds: float, **details) -> Run:
    return Run(steps=[seconds] * 4, peak_rss_bytes=2**30, cpu_seconds_per_step=0.5, details=details)


def test_table_and_summary_give_ratios_to_horovod(capsys: pytest.CaptureFixture[str]) -> None:
    point = Point(1000.0, 1.0, {
        "horovod-tape": Cell([run(1.0), run(1.2)]),
        "caramel-tape": Cell([run(1.1), run(1.1)]),
        "caramel-function": Cell([run(0.88, planned=True, predicted_step_seconds=0.8, planned_step_seconds=0.88), run(0.88, planned=False),
                                  run(0.88, planned=False, graph="horovod")]),
        "compute-only": Cell([run(0.6)]),
        "comm-only": Cell([run(0.6)]),
    })  # fmt: skip
    results = {"densenet121@1000": point}
    workloads = {"densenet121": make_workloads("emulated", ["densenet121"])[0]}
    strategies = ("horovod-tape", "caramel-tape", "caramel-function")
    zoo_bench.print_table(results, workloads, strategies)
    zoo_bench.print_summary(results, workloads, strategies)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("densenet121"))
    assert "many tiny tensors" in row
    # Horovod's median is 1.1 s: caramel-tape 1.0x, caramel-function 0.8x (its runs 0.88 s).
    assert " 1.000 (1.000-1.000)" in row and " 0.800 (0.800-0.800)" in row
    columns = [column.strip() for column in row.split("|")]
    # Predicted over measured; how each caramel-function run ended: the plan, Horovod's way in
    # Caramel's graph, Horovod's own graph.
    assert columns[-3:-1] == ["0.91", "PHG"]
    assert "caramel-function: geometric mean 0.800x horovod-tape over 1 points; at most 1.0x on 1" in out
    assert "planner: predicted against measured off by 9.1%" in out  # 0.8 / 0.88
