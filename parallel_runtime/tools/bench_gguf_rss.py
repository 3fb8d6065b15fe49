"""``bench gguf``'s ``stage_load_peak_rss_ratio``: the host memory a PipeFusion rank takes to load its share of a
GGUF file, over the GGML bytes of that share.

Each rank is measured in a fresh process of its own (``spawn``), one after the other. The process first
loads the same rank's share of a *warm-up* file (the same family and quantisation, two blocks, 256 wide)
and drops it: imports, lazily built tables and the allocator's first arenas are the process's fixed
cost, paid by any load, not this share's. Then freed heap pages are handed back (``malloc_trim``), the
resident-set peak is reset (``/proc/self/clear_refs`` 5: VmHWM := VmRSS) and the measured file's share is
loaded: the ratio is (VmHWM after - VmRSS before) / bytes of parameters the rank holds. What remains above
1 is the load's own transient and what the model object itself keeps besides its parameters (its module
tree and constructor-computed tables: Qwen-Image's rope tables are 4 MiB), which does not grow with the
share; the measured file is sized so that its share is over 100 MiB in every type measured.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from pathlib import Path
from typing import Any


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_share(path: str, warmup: str, pp: int, stage: int) -> dict[str, Any]:
    """In this process: load ``stage``'s share of ``warmup`` and drop it, then measure loading ``stage``'s share
    of ``path`` (bf16 compute, CPU)."""
    import torch

    from ..models.host_heap import release_freed_heap
    from ..pipefusion.stage_loading import load_single_file_stage

    torch.set_num_threads(1)
    warm = load_single_file_stage(warmup, pp, stage, "cpu", torch.bfloat16)
    del warm
    release_freed_heap()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    comps, _, weights = load_single_file_stage(path, pp, stage, "cpu", torch.bfloat16)
    seconds = time.perf_counter() - t0
    peak, after = _status_kib("VmHWM"), _status_kib("VmRSS")
    held = weights.param_bytes
    del comps
    return {
        "stage": stage,
        "held_bytes": held,
        "peak_increase": (peak - before) * 1024,
        "kept_increase": (after - before) * 1024,
        "ratio": round((peak - before) * 1024 / held, 4),
        "seconds": round(seconds, 3),
    }


def stage_rss(path: Path, warmup: Path, pp: int = 2, timeout: float = 900) -> list[dict[str, Any]]:
    """:func:`measure_share` for every stage of ``pp``, each in a fresh process."""
    out = []
    context = multiprocessing.get_context("spawn")
    for stage in range(pp):
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as fresh:
            out.append(fresh.submit(measure_share, str(path), str(warmup), pp, stage).result(timeout))
    return out
