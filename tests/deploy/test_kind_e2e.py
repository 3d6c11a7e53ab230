"""The whole stack on a kind cluster: scripts/kind-e2e.sh builds both images, installs the chart and
runs the portable cluster suite (tests/cluster) on it. These machines have no kind (nor any node image for it),
so here the test skips; it runs wherever kind and docker are installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.e2e


# A cold image build compiles Horovod; the job itself takes a few minutes at most.
@pytest.mark.timeout(3600)
def test_example_job_succeeds_on_a_kind_cluster() -> None:
    if shutil.which("kind") is None:
        pytest.skip("kind is not installed and no kind node image can be had on these machines")
    result = subprocess.run(["bash", str(REPO / "scripts" / "kind-e2e.sh")], cwd=REPO, timeout=3600)
    assert result.returncode == 0, "scripts/kind-e2e.sh failed: its captured output says where"
