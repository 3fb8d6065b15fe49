"""A full memory barrier between processes that share memory (the shared-memory rings' fence).

A ring writer stores a message and then its ``written`` flag; a reader loads the flag and then the
message. On x86 (TSO) stores are not reordered with stores, nor loads with loads, so program order
is enough. On weakly ordered CPUs (aarch64: Grace Hopper, Ampere, Apple) both sides need a real
fence — a lock taken and released by one process orders nothing for another. The fence used here
is libatomic's ``atomic_thread_fence(memory_order_seq_cst)`` (``dmb ish`` on aarch64, a locked
``or`` on x86-64), called through ctypes; libatomic ships with the GCC runtime on every Linux
distribution.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from collections.abc import Callable

from ..errors import ConfigError

SEQ_CST = 5  # memory_order_seq_cst
TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def _libatomic_fence() -> Callable[[], None] | None:
    for name in ("libatomic.so.1", ctypes.util.find_library("atomic")):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).atomic_thread_fence
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], None

        def fence(fn=fn) -> None:
            fn(SEQ_CST)

        return fence
    return None


def _program_order() -> None:
    """x86 without libatomic: the CPU keeps store->store and load->load order (a Python call is
    not reordered by a compiler), which is all the rings rely on."""


def resolve_fence(machine: str | None = None) -> tuple[str, Callable[[], None]]:
    """(kind, fence function): "libatomic" where libatomic exists, "tso" on x86 without it; a
    ConfigError on a weakly ordered CPU without libatomic (the rings would not be safe)."""
    fence = _libatomic_fence()
    if fence is not None:
        return "libatomic", fence
    machine = (machine or platform.machine()).lower()
    if machine in TSO_MACHINES:
        return "tso", _program_order
    raise ConfigError(
        f"no memory fence available on this {machine} machine",
        "the shared-memory queues between the host and the workers need a full memory barrier on CPUs "
        "that reorder memory accesses, and libatomic (the GCC runtime library providing it) was not found",
        "install libatomic (Debian/Ubuntu: apt install libatomic1; Fedora/RHEL: dnf install libatomic)",
    )


FENCE_KIND, full_fence = resolve_fence()
"""The fence of this machine, resolved once at import (a pure function; never changes)."""
