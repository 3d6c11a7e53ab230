"""`caramel run` refuses bad input with a message naming the field, and then starts nothing."""

from __future__ import annotations

import socket

import pytest

import caramel.launch.launcher
from caramel.launch.cli import main
from conftest import job_manifest, write_manifest


@pytest.fixture
def no_spawn(monkeypatch):
    """Stands in for process creation so that a test can prove none was attempted."""

    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(caramel.launch.launcher, "spawn", refuse)


def run_cli(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "message"),
    [("0", "argument --workers: must be at least 1, got 0"), ("two", "argument --workers: must be a whole number, got 'two'")],
)
def test_bad_workers_flag_is_named(tmp_path, capsys, no_spawn, flag, message):
    path = write_manifest(tmp_path, job_manifest())
    with pytest.raises(SystemExit) as exited:
        main(["run", str(path), "--workers", flag])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_flag_is_named(tmp_path, capsys, no_spawn):
    with pytest.raises(SystemExit) as exited:
        main(["run", str(write_manifest(tmp_path, job_manifest())), "--replicas", "3"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --replicas 3" in capsys.readouterr().err


def test_invalid_field_is_named_and_nothing_starts(tmp_path, capsys, no_spawn):
    manifest = job_manifest()
    manifest["spec"]["workers"] = {"replicas": 2, "slotsPerWorker": -1}
    code, err = run_cli(capsys, "run", str(write_manifest(tmp_path, manifest)))
    assert code == 2
    assert "spec.workers.slotsPerWorker: Input should be greater than or equal to 1 (got -1)" in err


def test_workers_flag_overrides_replicas_through_validation(tmp_path, capsys, monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, job, on_log, on_progress, on_notice):
            seen["replicas"] = job.spec.workers.replicas

        def run(self):
            raise caramel.launch.launcher.LaunchError("recorded")

    monkeypatch.setattr("caramel.launch.cli.LocalRun", Recorder)
    code, _ = run_cli(capsys, "run", str(write_manifest(tmp_path, job_manifest())), "--workers", "5")
    assert code == 2 and seen["replicas"] == 5


def test_missing_script_is_named_and_nothing_starts(tmp_path, capsys, no_spawn):
    code, err = run_cli(capsys, "run", str(write_manifest(tmp_path, job_manifest(script="no/such/train.py"))))
    assert code == 2
    assert "spec.script: 'no/such/train.py' is not a file" in err


def test_busy_rendezvous_port_is_named_and_nothing_starts(tmp_path, capsys, no_spawn):
    manifest = job_manifest()
    with socket.socket() as busy:
        busy.bind(("", manifest["spec"]["rendezvous"]["port"]))
        busy.listen()
        code, err = run_cli(capsys, "run", str(write_manifest(tmp_path, manifest)))
    assert code == 2
    assert f"spec.rendezvous.port: port {manifest['spec']['rendezvous']['port']} is already in use" in err


def test_missing_job_file_is_reported(tmp_path, capsys, no_spawn):
    code, err = run_cli(capsys, "run", str(tmp_path / "absent.yaml"))
    assert code == 2
    assert "cannot read job file" in err and "absent.yaml" in err
