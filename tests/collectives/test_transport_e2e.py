"""The tree transport in real workers: `caramel run --topology` against Horovod's allreduce."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO, free_port_block, job_manifest, run_caramel, write_manifest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("racks", "hosts_per_rack"), [(1, 1), (3, 1), (2, 4)])
def test_multitree_averages_like_horovod_in_every_dtype(tmp_path, racks, hosts_per_rack):
    workers = racks * hosts_per_rack
    manifest = job_manifest(
        script=str(REPO / "tests" / "collectives" / "transport_worker.py"), args=[], workers={"replicas": workers},
        caramel={"allreduce": "multitree", "transportPort": free_port_block(workers)},
        runPolicy={"backoffLimit": 0}, metrics={"enabled": False},
    )  # fmt: skip
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        f"kind: racks\nracks: {racks}\nhostsPerRack: {hosts_per_rack}\nlink: {{gbps: 10}}\nuplink: {{gbps: 2.5}}\n"
    )
    result = run_caramel("run", str(write_manifest(tmp_path, manifest)), "--topology", str(topology))
    assert result.returncode == 0, result.stderr
    checks = [json.loads(line) for line in re.findall(r"rank \d+ \| (\{.*\})", result.stderr)]
    assert len(checks) == workers * 4 * 4  # every rank: 4 dtypes x 4 sizes
    assert {check["dtype"] for check in checks} == {"float32", "float64", "float16", "bfloat16"}
    assert all(check["ok"] for check in checks), [check for check in checks if not check["ok"]]
