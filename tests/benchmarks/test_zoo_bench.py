"""The zoo benchmark's arguments, table and summary, from made-up runs (its runs need root's
emulated cluster and hours of workers: `make bench-zoo`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import zoo_bench
from benchmarks.accelerator_timelines import timeline_names
from benchmarks.plots import NO_MATPLOTLIB, draw
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
    assert args.mode == "graph-ops" and args.kernels == "graph-ops"
    # Horovod's tape first, then every public path on Caramel's default backend: Horovod's loop
    # unchanged, Caramel's tape in it, ctf.function, Keras fit. MultiWorkerMirroredStrategy's fit
    # is the baseline only where a strategy runs on TensorFlow's collectives.
    assert args.strategy_names == ("horovod-tape", "hvd-script", "caramel-tape", "caramel-function", "caramel", "caramel-fit-plain")
    assert zoo_bench.parse_args(["--strategies", "caramel-tape@hvd"]).strategy_names == ("horovod-tape", "caramel-tape@hvd")
    assert zoo_bench.parse_args(["--strategies", "caramel@tf"]).strategy_names == ("horovod-tape", "mwms-fit", "caramel@tf")
    # The three compute modes: the h200 mode replays every timeline at 10 and 25 GbE (k = 10).
    h200 = zoo_bench.parse_args(["--mode", "h200"])
    assert h200.profile_names == list(timeline_names()) and h200.rate_list == [1000.0, 2500.0] and h200.kernels == "graph-ops"
    assert zoo_bench.parse_args(["--mode", "device-clock"]).kernels == "device-clock"
    assert zoo_bench.parse_args(["--profiles", "regimes"]).profile_names == list(zoo_bench.REGIME_PROFILES)
    assert {zoo_bench.REGIMES[name] for name in zoo_bench.REGIME_PROFILES} == set(zoo_bench.REGIMES.values())
    assert "--profiles: unknown resnet50 in the h200 mode" in parse_error(capsys, "--mode", "h200", "--profiles", "resnet50")
    assert "--calibrate: the operating points are calibrated in the graph-ops mode" in parse_error(capsys, "--mode", "h200", "--calibrate")
    assert "--time-scale: must be above 0" in parse_error(capsys, "--time-scale", "0")
    assert "--profiles: unknown lenet" in parse_error(capsys, "--profiles", "lenet")
    assert "--strategies: unknown nccl" in parse_error(capsys, "--strategies", "nccl")
    assert "--strategies: horovod no longer runs" in parse_error(capsys, "--strategies", "horovod")
    assert "--steps: 8 steps are fewer than 3 executions of --steps-per-execution 4" in parse_error(capsys, "--steps", "8")
    assert "--rates: expected comma-separated Mbit/s" in parse_error(capsys, "--rates", "fast")
    assert "--repeats: must be at least 1, got 0" in parse_error(capsys, "--repeats", "0")
    assert "--job-steps: must be at least 1, got 0" in parse_error(capsys, "--job-steps", "0")
    assert "--worker-env: expected NAME=VALUE" in parse_error(capsys, "--worker-env", "HOROVOD_TIMELINE")
    assert zoo_bench.parse_args(["--worker-env", "HOROVOD_TIMELINE=/tmp/t.json"]).worker_env == [("HOROVOD_TIMELINE", "/tmp/t.json")]


def run(seconds: float, **details) -> Run:
    return Run(steps=[seconds] * 4, peak_rss_bytes=2**30, cpu_seconds_per_step=0.5, details=details)


def test_table_and_summary_give_ratios_to_both_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    point = Point(1000.0, 1.0, {
        "horovod-tape": Cell([run(1.0), run(1.2)]),
        "mwms-fit": Cell([run(1.76), run(1.76)]),
        "caramel-tape@hvd": Cell([run(1.1, backend="horovod"), run(1.1, backend="horovod")]),
        "caramel-function@tf": Cell([
            run(0.88, backend="tensorflow", planned=True, predicted_step_seconds=0.8, planned_step_seconds=0.88,
                plan_bytes_per_second=62.5e6),
            run(0.88, backend="tensorflow", planned=False),
            run(0.88, backend="tensorflow", planned=False, graph="own"),
        ]),
        "compute-only": Cell([run(0.6)]),
        "comm-only": Cell([run(0.6)]),
        "comm-only-tf": Cell([run(0.7)]),
    })  # fmt: skip
    results = {"densenet121@1000": point}
    workloads = {"densenet121": make_workloads("emulated", ["densenet121"])[0]}
    strategies = ("horovod-tape", "mwms-fit", "caramel-tape@hvd", "caramel-function@tf")
    zoo_bench.print_table(results, workloads, strategies)
    zoo_bench.print_summary(results, workloads, strategies)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("densenet121")]
    against_horovod, against_mwms = rows[0], rows[1]
    assert "many tiny tensors" in against_horovod and "many tiny tensors" in against_mwms
    # Horovod's median is 1.1 s: mwms-fit 1.6x, caramel-tape@hvd 1.0x, caramel-function@tf 0.8x (its runs 0.88 s).
    assert " 1.600 (1.600-1.600)" in against_horovod and " 1.000 (1.000-1.000)" in against_horovod and " 0.800 (0.800-0.800)" in against_horovod
    # MultiWorkerMirroredStrategy's median is 1.76 s: caramel-function@tf 0.5x; no inverse of mwms-fit over horovod-tape.
    assert " 0.500 (0.500-0.500)" in against_mwms and " 0.625 (0.625-0.625)" in against_mwms and "1.600" not in against_mwms
    # M is each baseline's own, and C + M beside it: Horovod's 0.6 s, TensorFlow's 0.7 s.
    assert against_horovod.split("|")[0].split()[-2:] == ["0.600", "1.200"] and against_mwms.split("|")[0].split()[-2:] == ["0.700", "1.300"]
    # Caramel's runs: step over C + M (0.88 / 1.3), beside Horovod's (1.1 / 1.2) and MWMS's (1.76 / 1.3);
    # predicted over measured; the link the plan was made for (62.5 MB/s) over the shaped 1 Gbit/s; how each
    # caramel-function@tf run ended: the plan, the backend's own way in Caramel's graph, the
    # backend's own graph.
    function = next(row for row in rows[2:] if "caramel-function@tf" in row)
    columns = [column.strip() for column in function.split("|")]
    assert columns[1].split() == ["0.677", "0.917", "1.354"]
    assert columns[3:6] == ["0.91", "0.50", "PHG"]
    assert columns[6].split() == ["1.00", "1.00"] and columns[7].split() == ["1.00", "1.00"]  # CPU and RSS over each baseline's
    # A per-step path made no plan: no link of a plan, and its runs ended on the backend's own way, by construction.
    tape = next(row for row in rows[2:] if "caramel-tape@hvd" in row)
    assert [column.strip() for column in tape.split("|")[4:6]] == ["nan", "--"]
    assert "caramel-function@tf: geometric mean 0.800x horovod-tape over 1 points (0.800-0.800); at most 1.0x on 1" in out
    assert "caramel-function@tf: geometric mean 0.500x mwms-fit over 1 points (0.500-0.500); at most 1.0x on 1; worst 0.500x (densenet121@1000)" in out
    assert "mwms-fit: geometric mean 1.600x horovod-tape" in out and "horovod-tape: geometric mean" not in out
    assert "best Caramel path: geometric mean 0.800x horovod-tape" in out and "best Caramel path: geometric mean 0.500x mwms-fit" in out
    assert "planner: predicted against measured off by 9.1% (median over 1 points and paths); the link the plans were made for: 0.50-0.50 of the shaped rate" in out


def test_graph_names_are_the_runtimes() -> None:
    """The driver imports no TensorFlow, so it names the backend's own graph itself."""
    from caramel.tensorflow.graph_choice import OWN_GRAPH

    assert zoo_bench.OWN_GRAPH == OWN_GRAPH
    assert zoo_bench.arms(Cell([run(1.0, graph=OWN_GRAPH), run(1.0, graph="horovod"), run(1.0, graph="caramel", planned=True)])) == "GGP"


def test_report_of_an_earlier_run_uses_its_strategies(tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--report prints the strategies the run measured (one from before the backends too: its
    Caramel runs on Horovod's collectives, bounded with Horovod's M) and draws its plot."""
    drawn = []
    monkeypatch.setattr(zoo_bench, "plot", lambda results, strategies, path: drawn.append((strategies, path)))
    point = Point(1000.0, 1.0, {"horovod-tape": Cell([run(1.0)]), "caramel-function": Cell([run(0.9)]), "compute-only": Cell([run(0.6)]),
                                "comm-only": Cell([run(0.6)])})  # fmt: skip
    results = tmp_path / "results.json"
    zoo_bench.save_results(results, {"densenet121@1000": point})
    assert zoo_bench.main(["--report", str(results)]) == 0
    out = capsys.readouterr().out
    assert "caramel-function: geometric mean 0.900x horovod-tape over 1 points" in out
    assert next(line for line in out.splitlines() if line.startswith("densenet121")).split("|")[-1].strip() != "nan"  # best/bnd
    assert drawn == [(("horovod-tape", "caramel-function"), results.with_name("zoo.png"))]


def test_a_report_joins_the_points_of_runs_in_parts_and_names_when_each_was_measured(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole zoo runs in parts: --report joins their results.json into one table, says when
    and at which commit each point was measured, writes the joined results where --output says,
    and refuses a point measured in two of them rather than keep one silently."""
    drawn = []
    monkeypatch.setattr(zoo_bench, "plot", lambda results, strategies, path: drawn.append((sorted(results), path)))

    def part(name: str, key: str, measured: str) -> Path:
        point = Point(1000.0, 1.0, {"horovod-tape": Cell([run(1.0)]), "caramel-function": Cell([run(0.8)]), "compute-only": Cell([run(0.6)]),
                                    "comm-only": Cell([run(0.6)])}, measured)  # fmt: skip
        (tmp_path / name).mkdir()
        zoo_bench.save_results(tmp_path / name / "results.json", {key: point})
        return tmp_path / name / "results.json"

    first = part("a", "densenet121@1000", "2026-12-06 10:00, commit abc1234")
    second = part("b", "mobilenet_v2@1000", "")
    joined = tmp_path / "joined"
    assert zoo_bench.main(["--report", str(first), str(second), "--output", str(joined)]) == 0
    out = capsys.readouterr().out
    assert "caramel-function: geometric mean 0.800x horovod-tape over 2 points" in out
    assert "densenet121@1000 2026-12-06 10:00, commit abc1234; mobilenet_v2@1000 when not recorded" in out
    assert drawn == [(["densenet121@1000", "mobilenet_v2@1000"], joined / "zoo.png")]
    again = zoo_bench.load_results(joined / "results.json")
    assert sorted(again) == ["densenet121@1000", "mobilenet_v2@1000"] and again["densenet121@1000"].measured.endswith("abc1234")

    twice = part("c", "densenet121@1000", "")
    assert zoo_bench.main(["--report", str(first), str(twice)]) == 2
    assert f"densenet121@1000 is in both {first} and {twice}" in capsys.readouterr().err


def test_a_benchmark_without_matplotlib_says_it_draws_no_plot_and_other_missing_modules_still_fail(tmp_path):
    def without(module):
        def plot(path):
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)

        return plot

    assert draw(without("matplotlib"), tmp_path / "zoo.png") == NO_MATPLOTLIB
    assert draw(lambda path: path.write_text("drawn"), tmp_path / "zoo.png") == f"plot: {tmp_path / 'zoo.png'}"
    with pytest.raises(ModuleNotFoundError):
        draw(without("numpy"), tmp_path / "zoo.png")


def test_the_cpu_floor_is_every_ranks_cpu_per_step_over_the_cores(capsys: pytest.CaptureFixture[str]) -> None:
    def timed(seconds: float, cpu: float, **details) -> Run:
        return Run(steps=[seconds] * 3, cpu_seconds_per_step=cpu, details=details)

    point = Point(4000.0, 1.0, {
        "horovod-tape": Cell([timed(1.0, 0.4)]),
        "caramel-function": Cell([timed(0.8, 0.3, backend="horovod", planned=True)]),
        "compute-only": Cell([timed(0.5, 0.05)]),
        "comm-only": Cell([timed(0.6, 0.25)]),
    }, workers=4, cores=2)  # fmt: skip
    # 4 ranks of 0.3 CPU-s per step on 2 cores: no step under 0.6 s; any schedule: the compute's
    # and the communication's CPU alone, (0.05 + 0.25) x 4 / 2
    assert point.cpu_floor("caramel-function") == pytest.approx(0.6)
    assert zoo_bench.cpu_bound_of_any_schedule(point, "caramel-function") == pytest.approx(0.6)
    unrecorded = Point(4000.0, 1.0, point.cells)  # a point saved before ranks and cores were
    assert math.isnan(zoo_bench.cpu_bound_of_any_schedule(unrecorded, "caramel-function"))
    workloads = {"resnet50": make_workloads("emulated", ["resnet50"])[0]}
    strategies = ("horovod-tape", "caramel-function")
    zoo_bench.print_table({"resnet50@4000": point}, workloads, strategies)
    zoo_bench.print_summary({"resnet50@4000": point}, workloads, strategies)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("resnet50")]
    assert rows[0].split()[-1] == "1.33"  # best/cpu: 0.8 s over 0.6 s
    assert [column.strip() for column in rows[1].split("|")][2].split()[1] == "1.33"  # /cpu, its own floor
    assert "the CPU floor of any schedule on 0 of 1 points where the cores were recorded" in out
