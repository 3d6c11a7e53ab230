"""The training processes' memory allocator: what the entrypoint adds to their environment
for each choice, and what it says when it cannot give the one chosen."""

from __future__ import annotations

from caramel.contract.api import MemoryAllocator
from caramel.launch.allocator import allocator_setup


def found(name: str) -> str:
    assert name == "tcmalloc_minimal"
    return "libtcmalloc_minimal.so.4"


def missing(name: str) -> None:
    return None


def test_tcmalloc_is_preloaded_and_serves_onednns_buffers():
    setup = allocator_setup(MemoryAllocator.TCMALLOC, {}, find_library=found)
    assert setup.env == {"LD_PRELOAD": "libtcmalloc_minimal.so.4", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}
    assert setup.description == "memory from tcmalloc (libtcmalloc_minimal.so.4)"


def test_the_jobs_own_onednn_switch_wins():
    setup = allocator_setup(MemoryAllocator.TCMALLOC, {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "0"}, find_library=found)
    assert setup.env["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "0"


def test_without_tcmalloc_the_worker_says_how_to_install_it_and_changes_nothing():
    """Without tcmalloc oneDNN keeps its pool: glibc's malloc would serve its buffers at
    0.4 CPU seconds a step more."""
    setup = allocator_setup(MemoryAllocator.TCMALLOC, {}, find_library=missing)
    assert setup.env == {}
    assert "tcmalloc not found" in setup.description
    assert "apt-get install libtcmalloc-minimal4" in setup.description


def test_a_job_that_preloads_something_itself_is_left_alone():
    setup = allocator_setup(MemoryAllocator.TCMALLOC, {"LD_PRELOAD": "libjemalloc.so.2"}, find_library=found)
    assert setup.env == {}
    assert "LD_PRELOAD is set by the job (libjemalloc.so.2)" in setup.description


def test_tensorflows_own_allocator_needs_nothing():
    setup = allocator_setup(MemoryAllocator.TENSORFLOW, {}, find_library=found)
    assert setup.env == {}
    assert "memoryAllocator: tensorflow" in setup.description
