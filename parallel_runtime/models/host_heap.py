"""Handing freed host memory back to the system before a load reads its weights.

glibc's allocator keeps freed memory in the process (RSS) when it lies in the heap rather than in its
own mapping, and it raises its mapping threshold each time a mapped block is freed, so after the first
large free every temporary below 32 MB comes from the heap. The temporaries of building a model (the
conversion plan's probe tensors, the traced meta model) then stay resident next to the weights read
after them: a few MB on every load, a fixed cost that is all of a small stage's overhead.
:func:`release_freed_heap` returns them (``malloc_trim``); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys


def release_freed_heap() -> None:
    """Give the heap's free pages back to the system (glibc)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
