"""The memory allocator of a worker's training processes (spec.workers.memoryAllocator).

TensorFlow's CPU kernels (oneDNN) keep their buffers in a pool of their own. It grows with
fragmentation and never hands memory back, so two processes holding the same live tensors can
differ widely in peak RSS. With TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 oneDNN asks malloc instead,
which glibc's malloc serves at a CPU cost per step and tcmalloc without one, so the two go
together or not at all.
An allocator can only be preloaded before the process starts, so the entrypoint puts it into
each training process's environment; the worker's own Python needs none.
(benchmarks/results/2026-11-24-vgg16-4000mbit-tcmalloc.txt has the measurements; benchmarks/results/2026-11-27-figures-from-code-comments.txt the
figures this comment once quoted.)
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from caramel.contract.api import MemoryAllocator

TCMALLOC = "tcmalloc_minimal"
ONEDNN_USES_MALLOC = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"


@dataclass(frozen=True)
class AllocatorSetup:
    """What the training processes' environment gains, and a line for the worker's log."""

    description: str
    env: dict[str, str] = field(default_factory=dict)


def allocator_setup(
    choice: MemoryAllocator,
    environ: Mapping[str, str],
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
) -> AllocatorSetup:
    """The environment that gives training processes `choice`, given the worker's environment."""
    if choice is MemoryAllocator.TENSORFLOW:
        return AllocatorSetup("memory from TensorFlow's own allocator (spec.workers.memoryAllocator: tensorflow)")
    if environ.get("LD_PRELOAD"):
        # The job preloads something itself (another allocator, a profiler): a second malloc
        # in the same process would be a crash, not a choice.
        return AllocatorSetup(f"LD_PRELOAD is set by the job ({environ['LD_PRELOAD']}): no allocator preloaded")
    library = find_library(TCMALLOC)
    if not library:
        return AllocatorSetup(
            "tcmalloc not found, so memory comes from TensorFlow's own allocator, whose pool can hold more "
            "(on Debian and Ubuntu: apt-get install libtcmalloc-minimal4)"
        )
    # A value the job gave for oneDNN's switch wins, as spec.env does everywhere else.
    return AllocatorSetup(
        f"memory from tcmalloc ({library})",
        {"LD_PRELOAD": library, ONEDNN_USES_MALLOC: environ.get(ONEDNN_USES_MALLOC, "1")},
    )
