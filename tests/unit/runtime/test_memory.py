"""release_free_memory hands freed heap back to the OS on glibc."""

from __future__ import annotations

import platform
from pathlib import Path

from runtime.memory import release_free_memory


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def test_freed_small_blocks_go_back_to_the_os() -> None:
    assert platform.libc_ver()[0] == "glibc", "this test needs glibc (Linux)"
    # many small blocks (below the mmap threshold) live in the heap; freed, glibc keeps them
    blocks = [bytearray(2000) for _ in range(100_000)]
    keep = blocks[-1]  # one live block at the top of the heap stops an automatic trim
    del blocks
    before = rss_kib()
    assert release_free_memory()
    after = rss_kib()
    assert before - after > 50_000, f"RSS {before} -> {after} KiB"
    assert keep
