"""PoolRegistry: one warm WorkerPool per distinct (devices, layout, key); reused when asked again."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

from ..parallel.config import ParallelConfig, parse_devices
from .pool import WorkerPool


class PoolRegistry:
    """Keeps pools alive between requests. A pool for other settings on overlapping GPUs replaces
    the old one (two pools would fight over the same GPU memory); CPU pools coexist."""

    def __init__(self, max_pools: int = 4):
        self.max_pools = max_pools
        self._pools: dict[tuple, WorkerPool] = {}
        self._lock = threading.Lock()

    def get(
        self,
        devices: str | Sequence[str],
        config: ParallelConfig,
        key: Hashable = None,
        **pool_options: Any,
    ) -> WorkerPool:
        """The pool for these settings, started if needed (warm if it already runs)."""
        devs = parse_devices(devices)
        full_key = (tuple(devs), config, key, tuple(sorted(pool_options.items())))
        with self._lock:
            for stale in [k for k, p in self._pools.items() if p.closed]:
                del self._pools[stale]  # closed elsewhere (e.g. one model unloaded): start afresh
            pool = self._pools.get(full_key)
            if pool is None:
                for other_key, other in list(self._pools.items()):
                    shared_gpu = set(devs) & set(other_key[0]) - {"cpu"}
                    if shared_gpu:
                        other.close()
                        del self._pools[other_key]
                while len(self._pools) >= self.max_pools:
                    oldest = next(iter(self._pools))
                    self._pools.pop(oldest).close()
                pool = WorkerPool(devs, config, **pool_options)
                self._pools[full_key] = pool
            else:
                self._pools[full_key] = self._pools.pop(full_key)  # most recently used last
        return pool.start()

    def pools(self) -> list[WorkerPool]:
        with self._lock:
            return list(self._pools.values())

    def close_all(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
