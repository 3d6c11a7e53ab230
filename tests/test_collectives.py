"""The TensorFlow side's reading of Horovod's response-cache size (no ranks needed)."""

from __future__ import annotations

import pytest

from caramel.tensorflow.collectives import HOROVOD_CACHE_CAPACITY, response_cache_capacity


def test_response_cache_capacity_defaults_to_horovods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    assert response_cache_capacity() == HOROVOD_CACHE_CAPACITY
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "0")
    assert response_cache_capacity() == 0


@pytest.mark.parametrize("value", ["many", "-1", "1.5", ""])
def test_a_bad_response_cache_capacity_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", value)
    with pytest.raises(ValueError, match=f"HOROVOD_CACHE_CAPACITY: expected a whole number of tensors \\(0: no cache\\), got '{value}'"):
        response_cache_capacity()
