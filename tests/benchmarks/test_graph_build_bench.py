"""The graph-build benchmark's reading of one job's call times."""

from __future__ import annotations

import pytest

from benchmarks.graph_build_bench import costs


def test_the_first_call_is_the_own_build_and_the_longest_later_one_caramels() -> None:
    # Calls: the own graph built (5.0), own steps, Caramel's graph built (12.0), steady executions.
    own, caramel, steady = costs([5.0, 1.0, 1.1, 12.0, 1.0, 0.9, 1.0, 1.0])
    assert (own, caramel, steady) == pytest.approx((4.0, 11.0, 1.0))
