"""Handing freed heap memory back to the operating system, for processes that run for days.

Each step a long-running node allocates and frees large transient buffers (a batch, a policy's
weights). glibc keeps freed memory in its arenas for reuse, so a process's resident size creeps up
with fragmentation even when nothing leaks. :func:`release_free_memory` asks glibc to return what it
can (``malloc_trim``); elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def release_free_memory() -> bool:
    """Return freed heap pages to the OS where the C library can; True when it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
