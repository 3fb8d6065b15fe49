"""CPU affinity for CPU-device workers.

Each CPU rank gets its own cores when the machine has enough of them: with two ranks on two
cores, an unpinned pair is often woken onto the same core (the waker's) and runs one after the
other while the other core idles; pinned ranks run side by side. When ranks x threads exceed the
cores the process may use, nothing is pinned and the kernel balances as usual. CUDA workers are
never pinned (their CPU threads feed the GPU and the kernel places them well enough).
"""

from __future__ import annotations

import contextlib
import os


def allowed_cpus() -> list[int]:
    """The cores this process may run on (its affinity mask), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def plan_cpu_affinity(devices: list[str], threads: int, cpus: list[int]) -> list[list[int] | None]:
    """Cores per rank: disjoint blocks of ``threads`` cores for CPU ranks, None (unpinned) for CUDA
    ranks or when the CPU ranks do not fit on ``cpus`` without sharing."""
    cpu_ranks = [r for r, d in enumerate(devices) if d == "cpu"]
    plan: list[list[int] | None] = [None] * len(devices)
    if not cpu_ranks or len(cpu_ranks) * threads > len(cpus):
        return plan
    for i, rank in enumerate(cpu_ranks):
        plan[rank] = cpus[i * threads : (i + 1) * threads]
    return plan


def apply_affinity(cpus: list[int] | None) -> None:
    """Pin this process to ``cpus`` (no-op for None or where unsupported)."""
    if cpus:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, cpus)
