"""The portable cluster suite: runs against whatever cluster KUBECONFIG (or ~/.kube/config)
points at, with kubectl and helm from .venv/bin. Skips, saying why, where no cluster answers.

    KUBECONFIG=~/.kube/config .venv/bin/python -m pytest -m cluster tests/cluster

The cluster's nodes must be able to pull CARAMEL_IMAGE (default caramel:0.1.0: with kind,
`kind load docker-image caramel:0.1.0`; scripts/kind-e2e.sh does all of it), it needs a default
StorageClass for the checkpoint volume, and a CNI that enforces NetworkPolicy for that to mean
anything (the suite checks the objects, not the packets).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.cluster import IMAGE, RELEASE, REPO, Namespace, cluster_unavailable, kubectl, run, tool


def pytest_collection_modifyitems(config, items):
    reason = cluster_unavailable()
    for item in items:
        if "tests/cluster" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def operator_release() -> Iterator[str]:
    """The chart installed with its CRD, in its own namespace; uninstalled at the end."""
    namespace = f"{RELEASE}-system"
    repository, _, tag = IMAGE.rpartition(":")
    run(tool("helm"), "install", RELEASE, str(REPO / "helm" / "caramel"), "--namespace", namespace, "--create-namespace",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "crds.keep=false", "--wait", "--timeout", "5m", timeout=600)
    kubectl("wait", "--for=condition=Established", "crd/carameljobs.caramel.dev", "--timeout=60s")
    try:
        yield namespace
    finally:
        run(tool("helm"), "uninstall", RELEASE, "--namespace", namespace, "--wait", check=False, timeout=300)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def namespace(operator_release: str) -> Iterator[Namespace]:
    space = Namespace()
    try:
        yield space
    finally:
        space.delete()
