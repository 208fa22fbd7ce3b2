"""Issue 52: freed memory is kept for reuse, so a training step does not fault its activations in again."""
from __future__ import annotations

import platform
import resource

import pytest
import torch

from core.runtime import keep_freed_memory


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_large_blocks_are_reused_not_faulted_in_again():
    assert keep_freed_memory() and keep_freed_memory()  # applies, and again is harmless

    def faults_of_a_step() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            x = torch.ones(12, 1024, 1024)  # 48 MiB (a fit step's activation): over glibc's default 32 MiB threshold
            del x
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    steps = [faults_of_a_step() for _ in range(6)]  # the heap grows over the first steps, then settles
    assert min(steps[3:]) < 1000  # 3 × 12,288 pages when every block is mapped and unmapped afresh
