"""The scheduling benchmark driver's pure parts: arguments, the operating point, recovery, events."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

import benchmarks.elastic_reform_bench as elastic_reform_bench
import benchmarks.quickstart_bench as quickstart_bench
import benchmarks.scheduling_bench as bench
from benchmarks.jobrun import RunResult, parse_event
from benchmarks.step_bounds import ordered_bounds
from benchmarks.workloads import REAL_MODELS, WORKER_APIS, WORKER_STRATEGIES, make_workloads
from caramel.contract.api import CaramelJob, MemoryAllocator, Scheduling
from caramel.contract.jobfile import parse_job


def parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_the_emulated_mode() -> None:
    args = bench.parse_args([])
    assert args.compute == "emulated"
    assert args.profile_names == ["resnet50", "vgg16", "bert_base"]
    assert args.strategy_names == bench.SWEEP_STRATEGIES
    assert args.rate_list == [1000, 2000, 4000, 8000]
    assert args.drop is None


def test_real_mode_defaults_to_every_example_model() -> None:
    args = bench.parse_args(["--compute", "real", "--strategies", "caramel@tf, horovod-tape", "--rates", "4000,1000"])
    assert args.profile_names == list(REAL_MODELS)
    assert args.strategy_names == ("caramel@tf", "horovod-tape")
    assert args.rate_list == [1000, 4000]


def test_bad_compute_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--compute: invalid choice: 'gpu'" in parse_error(capsys, "--compute", "gpu")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profiles", "small"], "--profiles: unknown small for --compute emulated (known: resnet50, vgg16, bert_base, densenet121,"),
        (["--compute", "real", "--profiles", "resnet50,vgg16"], "--profiles: unknown vgg16 for --compute real (known: resnet50, small)"),
        (["--profiles", ","], "--profiles: unknown (none given)"),
    ],
)
def test_bad_profiles(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert message in parse_error(capsys, *argv)


@pytest.mark.parametrize(
    ("strategies", "message"),
    [
        ("horovod-tape,compute-only", "--strategies: unknown compute-only"),
        ("", "--strategies: unknown (none given)"),
        # Horovod's Keras fit needs Keras 2: refused by name, with what to use instead.
        ("horovod,caramel@tf", "--strategies: horovod no longer runs: Horovod's Keras fit (hvd.DistributedOptimizer and its callbacks) needs Keras 2"),
        ("autotune", "use autotune-tape"),
    ],
)
def test_bad_strategies(capsys: pytest.CaptureFixture[str], strategies: str, message: str) -> None:
    assert message in parse_error(capsys, "--strategies", strategies)


def test_every_caramel_path_runs_on_each_backend_and_the_baselines_on_their_own() -> None:
    """Caramel's paths name their backend (spec.caramel.backend, the job's through the public API);
    the baselines run their libraries' own API, each bounded by its own collectives' M."""
    for path, api in (("caramel", None), ("caramel-tape", "tape"), ("caramel-function", "function")):
        for suffix, backend in (("@tf", "tensorflow"), ("@hvd", "horovod")):
            strategy = bench.STRATEGIES[path + suffix]
            assert (strategy.worker, strategy.api, strategy.caramel, strategy.backend) == ("caramel", api, {"backend": backend}, backend)
        # Caramel's defaults: auto, which takes Horovod's collectives wherever Horovod is installed.
        assert bench.STRATEGIES[path].caramel == {} and bench.STRATEGIES[path].backend == "horovod"
    # Plain Horovod's loop, unchanged under Caramel's horovod package.
    assert (bench.STRATEGIES["hvd-script"].worker, bench.STRATEGIES["hvd-script"].api) == ("hvd-script", "tape")
    assert "hvd-script" in bench.caramel_strategies(("horovod-tape", "hvd-script"))
    assert (bench.STRATEGIES["horovod-tape"].worker, bench.STRATEGIES["horovod-tape"].api, bench.STRATEGIES["horovod-tape"].backend) == ("horovod", "tape", "horovod")
    assert (bench.STRATEGIES["mwms-fit"].worker, bench.STRATEGIES["mwms-fit"].api, bench.STRATEGIES["mwms-fit"].backend) == ("mwms", "fit", "tensorflow")
    assert bench.STRATEGIES["mwms-loop"].api == "tape"
    assert bench.STRATEGIES["dear"].caramel["backend"] == "horovod"  # split collectives exist on Horovod's only
    assert bench.comm_strategies(("horovod-tape", "caramel@hvd")) == ["comm-only"]
    assert bench.comm_strategies(("horovod-tape", "mwms-fit")) == ["comm-only", "comm-only-tf"]


@pytest.mark.parametrize("spec", ["4000:1000", "4000:1000:x", "fast:1000:20", "1:2:3:4"])
def test_bad_rate_drop(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    assert "--rate-drop: expected FROM:TO:AT_STEP" in parse_error(capsys, "--rate-drop", spec)


def test_worker_env() -> None:
    args = bench.parse_args(["--worker-env", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1", "--worker-env", "LD_PRELOAD=/lib/a.so=b"])
    assert args.worker_env == [("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1"), ("LD_PRELOAD", "/lib/a.so=b")]
    assert bench.parse_args([]).worker_env == []


class ShapedLinks:
    """Stands in for root's emulated cluster (network namespaces, tc): only what a run asks of it."""

    interface = "crml-eth"

    def set_rate(self, rate_mbit: float) -> None:
        self.rate_mbit = rate_mbit


def test_a_runs_tail_is_the_time_after_its_last_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summary = {"event": "summary", "rank": 0, "cpu_seconds_per_step": 0.5}
    monkeypatch.setattr(bench, "run_job", lambda *args: RunResult(events=[summary], seconds=40.0, last_step_seconds=28.5))
    runner = bench.Bench(bench.parse_args(["--strategies", "horovod-tape"]), ShapedLinks(), tmp_path)
    workload, = make_workloads("emulated", ["resnet50"])
    run = runner.run(workload, "horovod-tape", 1000, 0, whole_job=True)
    assert (run.wall_seconds, run.after_steps_seconds) == (40.0, 11.5)


def test_worker_env_and_allocator_reach_every_strategys_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jobs = []

    def run_job(cluster: object, job: CaramelJob, timeout: float, log: Path, on_event: object) -> None:
        jobs.append(job)
        raise bench.RunFailed("not started: the test only reads the job")

    monkeypatch.setattr(bench, "run_job", run_job)
    args = bench.parse_args(
        ["--worker-env", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1", "--memory-allocator", "tensorflow", "--strategies",
         "horovod-tape,autotune-tape,caramel@hvd,mwms-fit,caramel-function@tf"]
    )  # fmt: skip
    runner = bench.Bench(args, ShapedLinks(), tmp_path)
    workload, = make_workloads("emulated", ["resnet50"])
    for strategy in args.strategy_names:
        assert runner.run(workload, strategy, 1000, 0).error
    for job in jobs:
        env = {variable.name: variable.value for variable in job.spec.env}
        assert env["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "1"
        assert job.spec.workers.memory_allocator == MemoryAllocator.TENSORFLOW
    assert "HOROVOD_AUTOTUNE" in {variable.name for variable in jobs[1].spec.env}
    assert "HOROVOD_AUTOTUNE" not in {variable.name for variable in jobs[0].spec.env}
    # Each strategy's worker, API and backend reach its job.
    commands = [job.spec.command[job.spec.command.index("--strategy") + 1 :: 2][:2] for job in jobs]
    assert commands == [["horovod", "tape"], ["horovod", "tape"], ["caramel", "fit"], ["mwms", "fit"], ["caramel", "function"]]
    assert [job.spec.caramel.backend.value for job in jobs] == ["auto", "auto", "horovod", "auto", "tensorflow"]


def test_memory_allocator(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.parse_args([]).memory_allocator == "tcmalloc"
    assert "--memory-allocator: invalid choice: 'jemalloc'" in parse_error(capsys, "--memory-allocator", "jemalloc")


def test_quickstart_bench_refuses_an_unknown_allocator(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        quickstart_bench.main(["--memory-allocator", "jemalloc"])
    assert "--memory-allocator: invalid choice: 'jemalloc'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        quickstart_bench.main(["--variants", "caramel@tf,nccl"])
    assert "--variants: unknown nccl" in capsys.readouterr().err


def test_quickstart_bench_runs_the_same_job_by_plain_horovod_and_on_each_backend() -> None:
    """The baseline is the benchmark's own script with the quickstart's arguments (the examples
    train with Caramel only); the Caramel variants are the quickstart as it is, on each backend."""
    job = yaml.safe_load(quickstart_bench.QUICKSTART.read_text())
    horovod = quickstart_bench.VARIANTS["horovod"](job)
    assert "script" not in horovod["spec"] and horovod["spec"]["command"][1:] == ["-m", "benchmarks.quickstart_horovod"]
    assert horovod["spec"]["args"] == job["spec"]["args"] and horovod["spec"]["workers"] == job["spec"]["workers"]
    for name, backend in (("caramel@tf", "tensorflow"), ("caramel@hvd", "horovod")):
        variant = quickstart_bench.VARIANTS[name](job)
        assert variant["spec"]["script"] == job["spec"]["script"] and variant["spec"]["args"] == job["spec"]["args"]
        assert parse_job(variant, source=name).spec.caramel.backend.value == backend
    assert parse_job(horovod, source="horovod").spec.command == horovod["spec"]["command"]
    assert "caramel" not in job["spec"]  # the variants leave the quickstart itself alone
    steps = {"horovod": [0.010, 0.012], "caramel@tf": [0.009, 0.009]}
    walls = {"horovod": [20.0, 22.0], "caramel@tf": [24.0, 24.0]}
    assert quickstart_bench.summary_line("caramel@tf", steps, walls) == (
        "quickstart caramel@tf_over_horovod=0.818 whole_run_caramel@tf_over_horovod=1.143"
    )


@pytest.mark.parametrize("setting", ["TF_ENABLE_ONEDNN_OPTS", "=0", "1X=0"])
def test_bad_worker_env(capsys: pytest.CaptureFixture[str], setting: str) -> None:
    assert f"--worker-env: expected NAME=VALUE such as TF_ENABLE_ONEDNN_OPTS=0, got {setting!r}" in parse_error(capsys, "--worker-env", setting)


def test_rate_drop() -> None:
    assert bench.parse_args(["--rate-drop", "4000:1000:20"]).drop == (4000.0, 1000.0, 20)


@pytest.mark.parametrize(("rates", "message"), [("1000,fast", "--rates: expected"), ("0,1000", "--rates: rates must be positive")])
def test_bad_rates(capsys: pytest.CaptureFixture[str], rates: str, message: str) -> None:
    assert message in parse_error(capsys, "--rates", rates)


def test_device_rate_only_for_emulated_compute(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--device-tflops: only with --compute emulated" in parse_error(capsys, "--compute", "real", "--device-tflops", "2")


def test_bad_cluster_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--cluster-prefix: prefix 'Crml-2'" in parse_error(capsys, "--cluster-prefix", "Crml-2")


def test_balanced_sweep_gives_the_closest_rate_unscaled() -> None:
    comm = {1000: 2.0, 2000: 1.1, 4000: 0.6}
    assert bench.choose_operating_point(1.0, comm) == (2000, None)
    assert bench.choose_operating_point(1.0, comm, scalable=False) == (2000, None)


def test_unbalanced_sweep_scales_the_device_at_the_fastest_communication() -> None:
    # M is at least twice C everywhere: the device is slowed down until C equals M at 4000 Mbit/s.
    rate, scale = bench.choose_operating_point(0.5, {1000: 4.0, 2000: 2.0, 4000: 1.5})
    assert rate == 4000
    assert scale == pytest.approx(0.5 / 1.5)


def test_unbalanced_sweep_without_a_device_takes_the_closest_rate() -> None:
    assert bench.choose_operating_point(0.5, {1000: 4.0, 2000: 2.0, 4000: 1.5}, scalable=False) == (4000, None)
    # Closest in ratio: 0.3 is 1.7 times C, 0.05 is 10 times less.
    assert bench.choose_operating_point(0.5, {1000: 0.05, 500: 0.3}, scalable=False) == (500, None)


def test_failed_runs_are_left_out_of_the_operating_point() -> None:
    assert bench.choose_operating_point(1.0, {1000: math.nan, 2000: 1.1}) == (2000, None)
    assert bench.choose_operating_point(1.0, {1000: math.nan}) is None
    assert bench.choose_operating_point(math.nan, {1000: 1.0}) is None
    assert bench.choose_operating_point(1.0, {}) is None


def test_balanced_within_the_tolerance() -> None:
    tolerance = bench.OPERATING_POINT_TOLERANCE
    assert bench.balanced(1.0, tolerance) and bench.balanced(1.0, 1 / tolerance)
    assert not bench.balanced(1.0, tolerance * 1.01) and not bench.balanced(1.0, 0.99 / tolerance)


def test_steps_to_recover() -> None:
    reference = 1.0
    assert bench.steps_to_recover([1.0, 1.05, 1.1], reference) == 0
    assert bench.steps_to_recover([3.0, 2.0, 1.05, 1.0, 1.1, 1.5], reference) == 2
    # Three in a row: a single good step between slow ones does not count.
    assert bench.steps_to_recover([3.0, 1.0, 3.0, 1.0, 1.0, 1.0], reference) == 3
    assert bench.steps_to_recover([3.0, 1.0, 1.0, 1.2], reference) is None
    assert bench.steps_to_recover([1.0, 1.0], reference) is None


def test_parse_event() -> None:
    assert parse_event('rank 0 | {"event": "step", "step": 3, "seconds": 0.5}') == {
        "event": "step", "step": 3, "seconds": 0.5, "rank": 0,
    }  # fmt: skip
    # A rank in the event itself is kept; the prefix only fills it in.
    assert parse_event('rank 2 | {"event": "summary", "rank": 1}') == {"event": "summary", "rank": 1}
    for line in ("rank 0 | starting", 'rank 0 | {"broken', "rank 0 | [1, 2]", '{"event": "step"}', 'rank x | {"a": 1}'):
        assert parse_event(line) is None


def test_peak_rss_of_the_largest_and_the_median_rank(capsys: pytest.CaptureFixture[str]) -> None:
    def run(*rss_mib: int) -> bench.Run:
        summaries = [
            {"event": "summary", "rank": rank, "peak_rss_bytes": mib * 2**20, "tensor_peak_bytes": (mib - 1000) * 2**20, "cpu_seconds_per_step": 1.0}
            for rank, mib in enumerate(rss_mib)
        ]
        return bench.collect([{"event": "step", "rank": 0, "seconds": 1.0}, *summaries])

    horovod = bench.Cell([run(3500, 3600, 4700, 3550), run(3400, 3500, 3600, 3700)])
    caramel = bench.Cell([run(4400, 4500, 4600, 4450)])
    assert horovod.peak_rss_bytes == 4700 * 2**20 and horovod.median_rank_rss_bytes == 3575 * 2**20
    workload, = make_workloads("emulated", ["vgg16"])
    point = bench.Point(4000, 1.25, {"horovod-tape": horovod, "caramel@hvd": caramel, "compute-only": caramel, "comm-only": caramel})
    bench.print_table(workload, [point], point, ("horovod-tape", "caramel@hvd"), workers=4)
    out = capsys.readouterr().out
    assert "peak RSS MiB, largest (median) rank: horovod-tape 4700 (3575), caramel@hvd 4600 (4475)" in out
    assert "peak MiB in tensors, largest rank: horovod-tape 3700, caramel@hvd 3600" in out
    # Caramel's largest rank over Horovod's: 4600 / 4700 MiB; its CPU alike.
    assert "caramel@hvd E" in out and "over horovod-tape: step 1.000x, peak RSS 0.98x, CPU 1.00x" in out
    assert "tensor_peak_bytes" not in caramel.runs[0].details
    # With oneDNN off, TensorFlow's allocator keeps no count: the workers say null.
    uncounted = bench.collect([{"event": "summary", "rank": 0, "peak_rss_bytes": 2**30, "tensor_peak_bytes": None}])
    assert uncounted.tensor_peak_bytes is None and bench.Cell([uncounted]).tensor_peak_bytes is None
    assert bench.mebibytes(None) == "n/a" and bench.mebibytes(3 * 2**20) == "3"


def test_workloads_of_each_mode() -> None:
    emulated, = make_workloads("emulated", ["resnet50"], device_tflops=2.5)
    assert emulated.scalable and emulated.device_tflops == 2.5 and emulated.device == "2.5 TFLOP/s"
    assert emulated.command("horovod", "fit", 10, 3, 4)[1:] == [
        "-m", emulated.worker, "--profile", "resnet50", "--device-tflops", "2.5", "--kernels", "graph-ops",
        "--gradients", "computed", "--strategy", "horovod", "--api", "fit", "--steps", "10", "--warmup", "3", "--steps-per-execution", "4",
    ]  # fmt: skip
    unshaped = make_workloads("emulated", ["resnet50"], gradients="unshaped")[0]
    assert unshaped.worker_args[-2:] == ("--gradients", "unshaped") and unshaped.scaled(1.0).gradients == "unshaped"
    slower = emulated.scaled(1.25)
    assert slower.device_tflops == 1.25 and slower.compute_seconds == pytest.approx(2 * emulated.compute_seconds)
    assert make_workloads("emulated", ["resnet50"], kernels="device-clock")[0].worker_args[-4:-2] == ("--kernels", "device-clock")
    # A measured timeline, ten times slower than the H200 it was measured on.
    timeline, = make_workloads("emulated", ["h200_resnet50"], device_tflops=0.1)
    assert timeline.timeline and timeline.device == "H200 x10" and timeline.device_tag == "x10"
    real, = make_workloads("real", ["small"])
    assert not real.scalable and real.device_tflops is None and real.device_tag == "real"
    assert real.gradient_bytes == 4 * REAL_MODELS["small"].parameters
    assert real.command("caramel", "function", 5, 2, 1)[1:] == [
        "-m", real.worker, "--model", "small", "--strategy", "caramel", "--api", "function", "--steps", "5", "--warmup", "2",
        "--steps-per-execution", "1",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no device rate"):
        real.scaled(1.0)


def test_table_with_failed_and_left_out_strategies(capsys: pytest.CaptureFixture[str]) -> None:
    workload, = make_workloads("real", ["small"])
    ran = bench.Cell([bench.Run(steps=[0.1, 0.2, 0.3], peak_rss_bytes=2**30)])
    point = bench.Point(1000, None, {"horovod-tape": bench.Cell([bench.Run(error="timed out")]), "caramel@hvd": ran,
                                     "compute-only": ran, "comm-only": ran})  # fmt: skip
    strategies = ("horovod-tape", "autotune-tape", "caramel@hvd")
    bench.print_table(workload, [point], point, strategies, workers=4)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("   1000"))
    assert row.startswith("   1000    real |") and row.endswith("<- operating point")
    assert row.count("failed") == 1 and row.count("not run") == 1
    assert bench.summary_lines("small", point, strategies) == [
        "small caramel@hvd speedup_vs_horovod-tape=nan speedup_vs_autotune-tape=nan of_bound=1.000"
    ]


def test_anchor_strategies_are_caramel_runs_with_valid_settings(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench.parse_args(["--strategies", "horovod-tape,bytescheduler,caramel-arrival", "--steps-per-execution", "2"])
    assert args.strategy_names == ("horovod-tape", "bytescheduler", "caramel-arrival") and args.steps_per_execution == 2
    for name, strategy in bench.STRATEGIES.items():
        Scheduling.model_validate(strategy.caramel)  # what the job's spec.caramel will say
        assert strategy.worker in WORKER_STRATEGIES and strategy.description, name
        assert strategy.api is None or strategy.api in WORKER_APIS[strategy.worker], name
        assert strategy.backend in ("horovod", "tensorflow"), name
    assert "--steps-per-execution: must be at least 1" in parse_error(capsys, "--steps-per-execution", "0")


def test_cpu_floor_is_every_ranks_cpu_over_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    cell = bench.Cell([bench.Run(steps=[1.0], cpu_seconds_per_step=0.3), bench.Run(steps=[1.0], cpu_seconds_per_step=0.4)])
    assert bench.cpu_floor_seconds(cell, workers=4) == pytest.approx(4 * 0.35 / 2)


def test_warmup_covers_caramels_first_rounds() -> None:
    """The default warm-up ends once Caramel runs what its first rounds chose: the arm, then the graph."""
    # Steps 1-4 on the own graph stamp the releases (the run waits for the first plan's search at
    # their end), 5-8 settle the plan in Caramel's graph, then 4 blocks of 4 of each round.
    assert bench.parse_args([]).warmup == 24 + 16
    assert bench.parse_args(["--steps-per-execution", "8"]).warmup == 16 + 2 * 4 * 8  # blocks of whole executions
    assert bench.parse_args(["--steps-per-execution", "1", "--steps", "3"]).warmup == 2 + 2 * 4 * 4


def test_warmup_short_of_caramels_replan(capsys: pytest.CaptureFixture[str]) -> None:
    message = parse_error(capsys, "--steps-per-execution", "8", "--warmup", "24")
    assert "--warmup: 24 steps end before Caramel's first rounds chose the backend's own way or its plan, and its graph or the backend's" in message
    assert "use at least 80" in message
    # The baselines alone do not re-plan.
    assert bench.parse_args(["--strategies", "horovod-tape,mwms-fit", "--warmup", "3"]).warmup == 3
    assert "--warmup: 3 steps end before" in parse_error(capsys, "--strategies", "horovod-tape", "--warmup", "3", "--rate-drop", "4000:1000:20")


def test_negative_warmup(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--warmup: must be 0 or more steps, got -1" in parse_error(capsys, "--strategies", "horovod-tape", "--warmup", "-1")


def test_steps_cover_three_executions(capsys: pytest.CaptureFixture[str]) -> None:
    message = parse_error(capsys, "--steps", "16", "--steps-per-execution", "8")
    assert "--steps: 16 steps are fewer than 3 executions of --steps-per-execution 8" in message


class InterruptedBench:
    """Stands in for `Bench`, whose runs need root's emulated cluster and minutes of workers:
    each run takes 1 s a step, and the user presses Ctrl-C during the `interrupt_at`-th run."""

    def __init__(self, interrupt_at: int) -> None:
        self.args = bench.parse_args(["--rates", "1000,2000", "--strategies", "horovod-tape,caramel@hvd", "--repeats", "2"])
        self.runs = []
        self.interrupt_at = interrupt_at

    def run(self, workload: object, strategy: str, rate: float, repeat: int) -> bench.Run:
        self.runs.append((strategy, rate, repeat))
        if len(self.runs) == self.interrupt_at:
            raise KeyboardInterrupt
        return bench.Run(steps=[1.0])

    def say(self, message: str) -> None:
        pass


def test_an_interrupted_sweep_keeps_every_finished_run() -> None:
    workload, = make_workloads("emulated", ["resnet50"])
    # 2 compute-only runs, then per rate 2 repeats of comm-only, horovod-tape, caramel@hvd:
    # interrupted at the second rate's first caramel@hvd run.
    interrupted = InterruptedBench(interrupt_at=2 + 6 + 3)
    saved = []
    with pytest.raises(KeyboardInterrupt):
        bench.bench_workload(interrupted, workload, interrupted.args.rate_list, lambda points, operating: saved.append((list(points), operating)))
    points, operating = saved[-1]
    assert operating is None and [point.rate_mbit for point in points] == [1000, 2000]
    assert {name: len(cell.runs) for name, cell in points[0].cells.items()} == {"compute-only": 2, "comm-only": 2, "horovod-tape": 2, "caramel@hvd": 2}
    assert {name: len(cell.runs) for name, cell in points[1].cells.items()} == {"compute-only": 2, "comm-only": 1, "horovod-tape": 1}
    assert len(saved) == 6 + 2  # after each run of the sweep that finished


def test_table_gives_the_ordered_bounds_and_caramels_link_time_for_emulated_compute(capsys: pytest.CaptureFixture[str]) -> None:
    def cell(seconds: float) -> bench.Cell:
        return bench.Cell([bench.Run(steps=[seconds])])

    workload, = make_workloads("emulated", ["bert_base"])
    point = bench.Point(4000, 1.0, {
        "horovod-tape": cell(3.15), "compute-only": cell(2.272), "comm-only": cell(1.873),
        "caramel@hvd": bench.Cell([bench.Run(steps=[3.19], details={"backend": "horovod", "communication_seconds_per_step": 2.5, "exposed_seconds_per_step": 0.9}),
                                   bench.Run(steps=[3.2], details={"backend": "horovod", "communication_seconds_per_step": 2.7, "exposed_seconds_per_step": 1.0})]),
    })  # fmt: skip
    bench.print_table(workload, [point], point, ("horovod-tape", "caramel@hvd"), workers=4)
    line = next(line for line in capsys.readouterr().out.splitlines() if "release and read order" in line)
    bounds = ordered_bounds(workload.profile, 2.272, 1.873)
    assert "horovod's M:" in line
    assert f"steps of {bounds.any_schedule:.3f} s to any schedule and {bounds.step_barrier:.3f} s to one whose step waits" in line
    assert f"horovod-tape {3.15 / bounds.step_barrier:.2f}x the second, caramel@hvd {3.195 / bounds.any_schedule:.2f}x the first" in line
    assert "caramel@hvd's transfers held the link 2.500-2.700 s a step (M 1.873 s), its steps waited 0.900-1.000 s for them" in line
    # Strategies on TensorFlow's collectives are bounded with TensorFlow's M, in a line of its own.
    point.cells |= {"comm-only-tf": cell(2.5), "mwms-fit": cell(3.6), "caramel@tf": cell(3.3)}
    bench.print_table(workload, [point], point, ("horovod-tape", "mwms-fit", "caramel@hvd", "caramel@tf"), workers=4)
    out = capsys.readouterr().out
    tf_line = next(line for line in out.splitlines() if "tensorflow's M:" in line)
    tf_bounds = ordered_bounds(workload.profile, 2.272, 2.5)
    assert f"mwms-fit {3.6 / tf_bounds.step_barrier:.2f}x the second, caramel@tf {3.3 / tf_bounds.any_schedule:.2f}x the first" in tf_line
    assert "horovod-tape" not in tf_line and "caramel@hvd" not in tf_line
    assert f"caramel@tf E {point.efficiency('caramel@tf'):.2f}, {3.3 / max(2.272, 2.5):.2f}x its bound max(C, M tensorflow)" in out
    assert "ratios: /H over horovod-tape, /M over mwms-fit" in out
    # Only the strategies that ran are set against a bound.
    del point.cells["horovod-tape"]
    bench.print_table(workload, [point], point, ("caramel@hvd",), workers=4)
    line = next(line for line in capsys.readouterr().out.splitlines() if "release and read order" in line)
    assert "(the baselines'); caramel@hvd" in line and "horovod-tape" not in line
    # Real compute has no per-layer times to bound with.
    assert make_workloads("emulated", ["resnet50"], kernels="device-clock")[0].worker_args[-4:-2] == ("--kernels", "device-clock")
    # A measured timeline, ten times slower than the H200 it was measured on.
    timeline, = make_workloads("emulated", ["h200_resnet50"], device_tflops=0.1)
    assert timeline.timeline and timeline.device == "H200 x10" and timeline.device_tag == "x10"
    real, = make_workloads("real", ["small"])
    bench.print_table(real, [point], point, ("horovod-tape", "caramel@hvd"), workers=4)
    assert "release and read order" not in capsys.readouterr().out


def test_report_prints_an_earlier_runs_tables_from_its_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def cell(*seconds: float, **details: object) -> bench.Cell:
        return bench.Cell([bench.Run(steps=[value], peak_rss_bytes=2**30, cpu_seconds_per_step=0.5, details=dict(details)) for value in seconds])

    point = bench.Point(2000, 0.875, {
        "compute-only": cell(0.87), "comm-only": cell(0.75), "comm-only-tf": cell(0.9), "horovod-tape": cell(1.19, 1.2),
        "mwms-fit": cell(1.3), "caramel@tf": cell(1.1, backend="tensorflow"), "caramel@hvd": cell(1.03, 1.04, backend="horovod"),
    })  # fmt: skip
    results = tmp_path / "results.json"
    bench.save_results(results, {"resnet50": ([point], point)})
    assert bench.main(["--report", str(results)]) == 0  # the run's own strategies
    out = capsys.readouterr().out
    assert next(line for line in out.splitlines() if line.startswith("   2000")).endswith("<- operating point")
    assert "release and read order" in out
    strategies = ("horovod-tape", "mwms-fit", "caramel@tf", "caramel@hvd")
    assert out.strip().endswith("\n".join(bench.summary_lines("resnet50", point, strategies)))
    assert f"resnet50 caramel@hvd speedup_vs_horovod-tape={1.195 / 1.035:.3f} speedup_vs_mwms-fit={1.3 / 1.035:.3f} of_bound={1.035 / 0.87:.3f}" in out
    assert f"resnet50 caramel@tf speedup_vs_horovod-tape={1.195 / 1.1:.3f} speedup_vs_mwms-fit={1.3 / 1.1:.3f} of_bound={1.1 / 0.9:.3f}" in out
    # A run recorded before the backends (Horovod's fit, Caramel on Horovod's collectives, which
    # reported no backend) still reports, Caramel bounded with Horovod's M.
    old = bench.Point(2000, 0.875, {"compute-only": cell(0.87), "comm-only": cell(0.95), "horovod": cell(1.19, 1.2), "caramel": cell(1.03, 1.04)})
    bench.save_results(results, {"resnet50": ([old], old)})
    assert bench.main(["--report", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(f"resnet50 caramel speedup_vs_horovod={1.195 / 1.035:.3f} of_bound={1.035 / 0.95:.3f}")
    results.write_text("{}" + "x")
    assert bench.main(["--report", str(results)]) == 2
    assert f"--report {results}: cannot be read as a results.json of --compute emulated" in capsys.readouterr().err


def test_the_elastic_reform_bench_runs_one_unchanged_script_each_way_as_a_valid_job() -> None:
    """Its three ways differ only in the backend and in whether the gang may run short."""
    jobs = {way: parse_job(elastic_reform_bench.job(way)) for way in elastic_reform_bench.WAYS}
    assert {(job.spec.caramel.backend.value, job.spec.workers.min_replicas) for job in jobs.values()} == {
        ("horovod", 2), ("tensorflow", 2), ("tensorflow", None),
    }  # fmt: skip
    assert {job.spec.script for job in jobs.values()} == {str(elastic_reform_bench.SCRIPT)}
