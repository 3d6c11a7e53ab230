"""The operator's RBAC comes from one place, caramel_operator.rbac: the committed copies (the
chart's rules, the cluster-wide and the namespaced manifests) must not drift from it. That the
rules are exactly what the operator uses, and that every variant grants exactly them, is
tests/operator/test_operator_permissions.py's and tests/deploy/test_chart.py's."""

from __future__ import annotations

import pytest
import yaml

from caramel_operator.rbac import OPERATOR_RULES, PERMISSIONS, VARIANTS
from conftest import REPO

# As the Makefile's RBAC_COPIES: path, variant.
COMMITTED = {
    "helm/caramel/files/rbac-rules.yaml": "chart",
    "manifests/rbac.yaml": "cluster",
    "manifests/namespaced/rbac-namespaced.yaml": "namespaced",
}


@pytest.mark.parametrize(("copy", "variant"), COMMITTED.items())
def test_committed_rbac_matches_the_rules(copy, variant):
    assert (REPO / copy).read_text() == VARIANTS[variant](), f"{copy} is stale: run `make rbac`"


def test_every_copy_the_makefile_writes_is_checked():
    makefile = (REPO / "Makefile").read_text()
    [line] = [line for line in makefile.splitlines() if line.startswith("RBAC_COPIES :=")]
    assert dict(item.split(":") for item in line.split(":=")[1].split()) == COMMITTED


def test_the_copies_are_yaml_of_the_rules():
    chart = yaml.safe_load(VARIANTS["chart"]())
    operator = chart["operator"]
    assert len(operator) == len(OPERATOR_RULES)
    granted = {(g, r, v) for rule in operator for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == PERMISSIONS
    assert ("scheduling.volcano.sh", "podgroups", "create") in PERMISSIONS
