"""Horovod's own tests, unchanged, on 2 ranks under Caramel and under real Horovod.

    python -m benchmarks.horovod_conformance --tests DIR                     # DIR: Horovod's test/parallel
    python -m benchmarks.horovod_conformance --tests DIR --files test_tensorflow.py --configurations caramel-tf-keras
    python -m benchmarks.horovod_conformance --report runs/horovod-conformance-<time>/results.json [more results.json]

The repository cannot ship Horovod's tests: DIR is a checkout's test/parallel (v0.28.1, whose
API Caramel serves). Each test file runs under each configuration:
    caramel-keras3     `caramel run` of a 2-worker CaramelJob whose command is pytest, on Keras 3
    caramel-tf-keras   the same on tf-keras (TF_USE_LEGACY_KERAS=1 in the job's env)
    horovod-tf-keras   real Horovod: `horovodrun --gloo -np 2 -H localhost:2`, each rank's pytest
                       started through `plain_horovod_runner` (Caramel's horovod off the path,
                       tf-keras for tf.keras and `keras`)
Every rank writes each test's outcome as it ends (`pytest_outcomes`, a pytest plugin), and
pytest-timeout ends a rank whose test outlasts --timeout (its thread method ends the process: a
rank blocked in a collective whose peer failed elsewhere cannot be interrupted), which ends the
run (Caramel's gang, horovodrun). The test a rank was in when its run ended fails, and the tests
no rank reached run again in a new run. A test passes only if it passed on every rank.

Progress goes to the terminal as the tests end; then a table per file (passed, failed, skipped per
configuration), the failures grouped by cause (the exception's first line, with the numbers in it
kept), and the tests that fail on real Horovod but pass on Caramel. Every run's job file, output
and outcome lines, and results.json, go to the output directory (runs/horovod-conformance-<time>/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import yaml

from benchmarks.horovod_scripts_bench import KERAS_2, REPOSITORY, commit
from benchmarks.pytest_outcomes import OUTCOMES_VARIABLE
from testbed.ports import free_port_block

CONFIGURATIONS = ("caramel-keras3", "caramel-tf-keras", "horovod-tf-keras")
HOROVOD = "horovod-tf-keras"
FILES = ("test_tensorflow.py", "test_tensorflow2_keras.py")
RANKS = 2
TEST_TIMEOUT_SECONDS = 120
RUN_STARTUP_SECONDS = 300
"""A run's whole time is bounded too, beyond its tests' timeouts: start-up and teardown."""
POLL_SECONDS = 2
ENDED_IN_TEST = "the rank's run ended in this test (pytest-timeout, a crash, or its peer's end)"
PYTEST_OPTIONS = ("-p", "benchmarks.pytest_outcomes", "-p", "no:cacheprovider", "-p", "no:cloudcoil", "-q", "-o", "timeout_method=thread")


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed, failed or skipped
    cause: str = ""


# -- reading the ranks' outcomes -----------------------------------------------------------------


def parse_rank(lines: Iterable[str]) -> tuple[dict[str, Outcome], list[str]]:
    """One rank's outcome lines (`pytest_outcomes`): each ended test's outcome, and the tests it
    started, in order."""
    ended: dict[str, Outcome] = {}
    started: list[str] = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a rank killed while writing it
        if record.get("event") == "start":
            started.append(record["test"])
        elif "outcome" in record:
            ended[record["test"]] = Outcome(record["outcome"], record.get("cause", ""))
    return ended, started


def decided(ranks: Sequence[tuple[dict[str, Outcome], list[str]]], run_ended: bool) -> dict[str, Outcome]:
    """The tests whose outcome is known from every rank's lines: ended on every rank, or (once the
    run ended) started on one: a rank that started a test and did not end it was ended in it. A
    test passes if it passed on every rank, fails if it failed on one (the cause a rank's own, before
    one that was ended), and is skipped otherwise."""
    result: dict[str, Outcome] = {}
    tests = dict.fromkeys(test for _, started in ranks for test in started)
    for test in tests:
        if not all(test in ended for ended, _ in ranks) and not run_ended:
            continue
        outcomes = [ended.get(test, Outcome("failed", ENDED_IN_TEST)) for ended, _ in ranks]
        failures = sorted((o for o in outcomes if o.outcome == "failed"), key=lambda o: o.cause == ENDED_IN_TEST)
        if failures:
            result[test] = failures[0]
        elif all(o.outcome == "passed" for o in outcomes):
            result[test] = Outcome("passed")
        else:
            result[test] = next(o for o in outcomes if o.outcome == "skipped")
    return result


def read_ranks(directory: Path) -> list[tuple[dict[str, Outcome], list[str]]]:
    ranks = []
    for rank in range(RANKS):
        path = directory / f"rank{rank}.jsonl"
        ranks.append(parse_rank(path.read_text().splitlines() if path.exists() else []))
    return ranks


# -- the runs ------------------------------------------------------------------------------------


def job_document(configuration: str, tests_dir: Path, pytest_args: Sequence[str], outcomes: Path) -> dict:
    """The CaramelJob of a Caramel configuration's run: 2 workers, whose command is pytest."""
    env = {
        "PYTHONUNBUFFERED": "1",
        # The plugin's package, and this process's path, so that the ranks run this checkout's Caramel.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        OUTCOMES_VARIABLE: str(outcomes),
        **(KERAS_2 if configuration == "caramel-tf-keras" else {}),
    }
    return {
        "apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": f"conformance-{configuration}"},
        "spec": {
            "command": [sys.executable, "-m", "pytest", *pytest_args], "workingDir": str(tests_dir),
            "workers": {"replicas": RANKS}, "rendezvous": {"port": free_port_block(1 + RANKS)}, "metrics": {"enabled": False},
            "runPolicy": {"backoffLimit": 0}, "env": [{"name": key, "value": value} for key, value in env.items()],
        },
    }  # fmt: skip


def plain_horovod_pytest() -> list[str]:
    """pytest, started as plain Horovod runs a script (`plain_horovod_runner`): pytest's __main__."""
    return [sys.executable, "-m", "benchmarks.plain_horovod_runner", str(Path(pytest.__file__).parent / "__main__.py")]


def plain_env(outcomes: Path | None = None) -> dict[str, str]:
    """The environment of real Horovod's ranks: only this repository on the path (the runner and
    the plugin), no Caramel."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPOSITORY)}
    if outcomes is not None:
        env[OUTCOMES_VARIABLE] = str(outcomes)
    return env


def run_command(configuration: str, tests_dir: Path, pytest_args: Sequence[str], directory: Path) -> tuple[list[str], dict[str, str], Path]:
    """The command of one run, its environment and its working directory."""
    if configuration == HOROVOD:
        horovodrun = str(Path(sys.executable).parent / "horovodrun")
        return [horovodrun, "--gloo", "-np", str(RANKS), "-H", f"localhost:{RANKS}", *plain_horovod_pytest(), *pytest_args], plain_env(directory), tests_dir
    job = directory / "job.yaml"
    job.write_text(yaml.safe_dump(job_document(configuration, tests_dir, pytest_args, directory), sort_keys=False))
    return [sys.executable, "-m", "caramel.launch.cli", "run", str(job)], dict(os.environ), REPOSITORY


def collect(tests_dir: Path, file: str, keyword: str | None = None) -> list[str]:
    """The test ids of a file (those pytest's -k `keyword` selects), as pytest collects them under
    real Horovod on tf-keras."""
    selection = ["-k", keyword] if keyword else []
    result = subprocess.run(
        [*plain_horovod_pytest(), "--collect-only", *PYTEST_OPTIONS, *selection, file],
        cwd=tests_dir, env=plain_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    ids = [line.strip() for line in result.stdout.splitlines() if line.startswith(f"{file}::")]
    if not ids:
        raise RuntimeError(f"pytest collected no tests of {file}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return ids


def run_file(
    configuration: str, tests_dir: Path, file: str, tests: Sequence[str], directory: Path, timeout: float, say: Callable[[str], None]
) -> dict[str, Outcome]:
    """Every test of the file under the configuration: runs of the tests no run reached yet, until
    every one has an outcome."""
    results: dict[str, Outcome] = {}
    for attempt in range(len(tests)):
        remaining = [test for test in tests if test not in results]
        if not remaining:
            break
        run_dir = directory / f"run{attempt}"
        run_dir.mkdir(parents=True)
        command, env, cwd = run_command(configuration, tests_dir, [*PYTEST_OPTIONS, f"--timeout={timeout:g}", *remaining], run_dir)
        with open(run_dir / "output.log", "w") as log:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + RUN_STARTUP_SECONDS + timeout * len(remaining)
            while process.poll() is None:
                if time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                time.sleep(POLL_SECONDS)
                _note(decided(read_ranks(run_dir), run_ended=False), results, len(tests), f"{configuration} {file}", say)
        _note(decided(read_ranks(run_dir), run_ended=True), results, len(tests), f"{configuration} {file}", say)
        if all(test not in results for test in remaining):
            say(f"{configuration} {file}: a run reached no test (exit {process.returncode}; {run_dir / 'output.log'})")
            results.update({test: Outcome("failed", f"never ran: the run ended before it (exit {process.returncode})") for test in remaining})
    return results


def _note(found: Mapping[str, Outcome], results: dict[str, Outcome], total: int, where: str, say: Callable[[str], None]) -> None:
    """Take in the outcomes not known yet, saying each."""
    new = {test: outcome for test, outcome in found.items() if test not in results}
    for test, outcome in new.items():
        results[test] = outcome
        why = f"  ({outcome.cause})" if outcome.outcome != "passed" else ""
        say(f"[{where} {len(results)}/{total}] {outcome.outcome:7} {short(test)}{why}")


def short(test: str) -> str:
    return test.rsplit("::", 1)[-1]


# -- the report ----------------------------------------------------------------------------------


def counts(results: Mapping[str, Outcome]) -> dict[str, int]:
    tally = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in results.values():
        tally[outcome.outcome] += 1
    return tally


def file_table(file: str, by_configuration: Mapping[str, Mapping[str, Outcome]]) -> list[str]:
    lines = [f"{file}", "| configuration | tests | passed | failed | skipped |", "| --- | --- | --- | --- | --- |"]
    for configuration, results in by_configuration.items():
        tally = counts(results)
        lines.append(f"| {configuration} | {len(results)} | {tally['passed']} | {tally['failed']} | {tally['skipped']} |")
    return lines


def by_cause(results: Mapping[str, Outcome]) -> dict[str, list[str]]:
    """The failed tests by cause, the commonest first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for test, outcome in results.items():
        if outcome.outcome == "failed":
            groups[outcome.cause].append(short(test))
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def cause_table(configuration: str, file: str, results: Mapping[str, Outcome]) -> list[str]:
    groups = by_cause(results)
    if not groups:
        return [f"{configuration}, {file}: no failures"]
    lines = [f"{configuration}, {file}: failures by cause", "| tests | cause | which |", "| --- | --- | --- |"]
    lines += [f"| {len(tests)} | {cause[:200]} | {', '.join(tests)} |" for cause, tests in groups.items()]
    return lines


def better_than_horovod(by_configuration: Mapping[str, Mapping[str, Outcome]]) -> dict[str, list[str]]:
    """Per Caramel configuration, the tests that fail on real Horovod and pass on it."""
    horovod = by_configuration.get(HOROVOD, {})
    failing = {test for test, outcome in horovod.items() if outcome.outcome == "failed"}
    return {
        configuration: [short(test) for test, outcome in results.items() if test in failing and outcome.outcome == "passed"]
        for configuration, results in by_configuration.items()
        if configuration != HOROVOD
    }


def report_lines(document: Mapping) -> list[str]:
    lines = [f"Horovod conformance at {document['commit']}: {document['command']}"]
    for file, by_configuration in document["files"].items():
        results = {configuration: {test: Outcome(**outcome) for test, outcome in tests.items()} for configuration, tests in by_configuration.items()}
        seconds = document["seconds"].get(file, {})
        lines += ["", *file_table(file, results)]
        lines += [f"  {configuration}: {seconds[configuration]:.0f} s" for configuration in results if configuration in seconds]
        for configuration, tests in results.items():
            lines += ["", *cause_table(configuration, file, tests)]
        for configuration, passing in better_than_horovod(results).items():
            if HOROVOD in results:
                lines += ["", f"{configuration}, {file}: fail on real Horovod, pass on Caramel: {', '.join(passing) or 'none'}"]
    return lines


def merged(documents: Sequence[Mapping]) -> dict:
    """One results document of several runs' (of other configurations, or files, or a rerun of some
    tests: the later run's outcome where two ran the same test; their times added)."""
    result: dict = {"commit": ", ".join(dict.fromkeys(document["commit"] for document in documents)),
                    "command": "; ".join(document["command"] for document in documents), "files": {}, "seconds": {}}  # fmt: skip
    for document in documents:
        for file, by_configuration in document["files"].items():
            for configuration, tests in by_configuration.items():
                result["files"].setdefault(file, {}).setdefault(configuration, {}).update(tests)
                seconds = result["seconds"].setdefault(file, {})
                seconds[configuration] = seconds.get(configuration, 0.0) + document["seconds"][file][configuration]
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.horovod_conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, help="Horovod's test/parallel (a checkout of v0.28.1)")
    parser.add_argument("--files", default=",".join(FILES), help=f"comma-separated test files (default {','.join(FILES)})")
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS), help=f"comma-separated, of {', '.join(CONFIGURATIONS)}")
    parser.add_argument("-k", dest="keyword", help="run only the tests this pytest -k expression selects")
    parser.add_argument("--timeout", type=float, default=TEST_TIMEOUT_SECONDS, help="seconds per test (pytest-timeout)")
    parser.add_argument("--output", type=Path, help="the output directory (default runs/horovod-conformance-<time>)")
    parser.add_argument("--report", type=Path, nargs="+", help="print the report of results.json files (of runs of other configurations or files), run nothing")
    args = parser.parse_args(argv)
    if args.report is None and args.tests is None:
        parser.error("give --tests DIR (Horovod's test/parallel) or --report results.json")
    unknown = set(args.configurations.split(",")) - set(CONFIGURATIONS)
    if unknown:
        parser.error(f"unknown configurations {sorted(unknown)}: choose among {', '.join(CONFIGURATIONS)}")
    return args


def main(argv: list[str] | None = None, say: Callable[[str], None] = lambda text: print(text, flush=True)) -> int:
    args = parse_args(argv)
    if args.report is not None:
        for line in report_lines(merged([json.loads(path.read_text()) for path in args.report])):
            say(line)
        return 0
    tests_dir = args.tests.resolve()
    output = (args.output or REPOSITORY / "runs" / f"horovod-conformance-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    output.mkdir(parents=True, exist_ok=True)
    document: dict = {"commit": commit(), "command": " ".join(["python -m benchmarks.horovod_conformance", *(argv if argv is not None else sys.argv[1:])]),
                      "files": {}, "seconds": {}}  # fmt: skip
    for file in args.files.split(","):
        tests = collect(tests_dir, file, args.keyword)
        say(f"{file}: {len(tests)} tests")
        for configuration in args.configurations.split(","):
            started = time.monotonic()
            results = run_file(configuration, tests_dir, file, tests, output / configuration / file, args.timeout, say)
            document["files"].setdefault(file, {})[configuration] = {test: asdict(outcome) for test, outcome in results.items()}
            document["seconds"].setdefault(file, {})[configuration] = time.monotonic() - started
            (output / "results.json").write_text(json.dumps(document, indent=1))
    for line in report_lines(document):
        say(line)
    say(f"results: {output / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
