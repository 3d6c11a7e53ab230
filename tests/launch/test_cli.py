"""`caramel run` refuses bad input with a message naming the field, and then starts nothing."""

from __future__ import annotations

import socket

import pytest

import caramel.launch.launcher
from caramel.launch.cli import main
from conftest import RACKS_TOPOLOGY, job_manifest, write_manifest


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


@pytest.fixture
def recorded_run(monkeypatch) -> dict:
    """Records the job and topology `caramel run` would start, instead of starting them."""
    seen = {}

    class Recorder:
        def __init__(self, job, on_log, on_progress, on_notice, topology=None):
            seen["job"], seen["topology"] = job, topology

        def run(self):
            raise caramel.launch.launcher.LaunchError("recorded")

    monkeypatch.setattr("caramel.launch.cli.LocalRun", Recorder)
    return seen


def test_workers_flag_overrides_replicas_through_validation(tmp_path, capsys, recorded_run):
    code, _ = run_cli(capsys, "run", str(write_manifest(tmp_path, job_manifest())), "--workers", "5")
    assert code == 2 and recorded_run["job"].spec.workers.replicas == 5


def test_workers_flag_below_min_replicas_is_named_and_nothing_starts(tmp_path, capsys, no_spawn):
    manifest = write_manifest(tmp_path, job_manifest(workers={"replicas": 4, "minReplicas": 3}))
    code, err = run_cli(capsys, "run", str(manifest), "--workers", "2")
    assert code == 2
    assert "with --workers 2 is not a valid CaramelJob" in err and "spec.workers.minReplicas: must not exceed replicas (2) (got 3)" in err




def test_topology_flag_hands_the_file_s_topology_to_the_run(tmp_path, capsys, recorded_run):
    (tmp_path / "racks.yaml").write_text(RACKS_TOPOLOGY)
    manifest = write_manifest(tmp_path, job_manifest())
    code, _ = run_cli(capsys, "run", str(manifest), "--workers", "4", "--topology", str(tmp_path / "racks.yaml"))
    assert code == 2 and recorded_run["topology"].size == 4
    assert recorded_run["topology"].groups == ("tor0", "tor0", "tor1", "tor1")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--topology: cannot read topology file"),
        ("kind: racks\nracks: 2\nhostsPerRack: 2\nlink: {gbps: -1}\nuplink: {gbps: 1}\n", "link.gbps"),
        ("kind: [\n", "is not valid YAML"),
        (RACKS_TOPOLOGY, "has 4 hosts; the job runs 2 ranks"),
    ],
)
def test_bad_topology_flag_is_named_and_nothing_starts(tmp_path, capsys, no_spawn, content, message):
    if content is not None:
        (tmp_path / "topology.yaml").write_text(content)
    code, err = run_cli(capsys, "run", str(write_manifest(tmp_path, job_manifest())), "--topology", str(tmp_path / "topology.yaml"))
    assert code == 2
    assert "--topology: " in err and message in err


def test_a_topology_for_a_gang_that_may_shrink_is_the_whole_gangs(tmp_path, capsys, recorded_run):
    """The file has a host for each rank of the whole gang; a gang of fewer workers runs on its
    first workers' hosts, and re-formed ranks on their round's (tests/contract/test_contract.py)."""
    (tmp_path / "racks.yaml").write_text(RACKS_TOPOLOGY)
    manifest = write_manifest(tmp_path, job_manifest(workers={"replicas": 4, "minReplicas": 2}))
    code, _ = run_cli(capsys, "run", str(manifest), "--topology", str(tmp_path / "racks.yaml"))
    assert code == 2 and recorded_run["topology"].size == 4


def test_busy_transport_port_is_named_for_a_job_that_may_run_multitree(tmp_path, capsys, no_spawn):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        manifest = job_manifest(caramel={"allreduce": "multitree", "transportPort": port - 1})
        code, err = run_cli(capsys, "run", str(write_manifest(tmp_path, manifest)))
    assert code == 2
    assert f"spec.caramel.transportPort (+1 for rank 1): port {port} is already in use" in err


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
