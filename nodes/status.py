"""StatusBoard: what the web panel shows (pools, devices, layout, memory and progress per rank).

Every change is sent as one small event through the bridge (``dit_parallel.status``); the panel
folds them with the reducer in ``web/status_model.js``. ``snapshot()`` is the full state, served
to a panel that opens late. Event shapes (all carry ``type``):

- ``{"type": "pool", "pool": id, "model", "family", "devices": [...], "layout", "reason", "state"}``
- ``{"type": "pool_closed", "pool": id}`` and ``{"type": "reset"}`` (every pool closed)
- ``{"type": "job", "pool": id, "job": "sample"|"decode"|"encode", "state": "running"|"done"|"cancelled"|"error", "message"?}``
- ``{"type": "progress", "pool": id, "rank": r, "step": s, "total": t, "patch"?: p, "patches"?: m}``
- ``{"type": "memory", "pool": id, "rank": r, "memory": {"allocated_bytes", "peak_bytes", "free_bytes", "total_bytes", "rss_bytes"}}``
- ``{"type": "snapshot", "pools": [...]}``
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .bridge import Bridge

_MEMORY_KEYS = ("allocated_bytes", "peak_bytes", "free_bytes", "total_bytes", "rss_bytes")


class StatusBoard:
    """Server-side mirror of the panel state; thread-safe (events may arrive from any thread)."""

    def __init__(self, bridge: Bridge):
        self.bridge = bridge
        self._pools: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _send(self, event: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the panel is a convenience: never fail a node for it
            self.bridge.send_status(event)

    def pool_loaded(self, pool: str, model: str, family: str, devices: Sequence[str], layout: str, reason: str) -> None:
        event = {
            "type": "pool",
            "pool": pool,
            "model": model,
            "family": family,
            "devices": list(devices),
            "layout": layout,
            "reason": reason,
            "state": "ready",
        }
        with self._lock:
            entry = self._pools.setdefault(pool, {"ranks": {}, "job": None})
            entry.update({k: v for k, v in event.items() if k != "type"})
        self._send(event)

    def pool_closed(self, pool: str) -> None:
        with self._lock:
            self._pools.pop(pool, None)
        self._send({"type": "pool_closed", "pool": pool})

    def reset(self) -> None:
        with self._lock:
            self._pools.clear()
        self._send({"type": "reset"})

    def job(self, pool: str, job: str, state: str, message: str | None = None) -> None:
        event: dict[str, Any] = {"type": "job", "pool": pool, "job": job, "state": state}
        if message:
            event["message"] = message[:500]
        with self._lock:
            entry = self._pools.get(pool)
            if entry is not None:
                entry["job"] = {k: v for k, v in event.items() if k not in ("type", "pool")}
                if state == "running":
                    for rank in entry["ranks"].values():
                        rank.pop("step", None), rank.pop("patch", None)
        self._send(event)

    def progress(self, pool: str, rank: int, payload: Mapping[str, Any]) -> None:
        event: dict[str, Any] = {"type": "progress", "pool": pool, "rank": int(rank)}
        for key in ("step", "total", "patch", "patches"):
            if isinstance(payload.get(key), (int, float)):
                event[key] = int(payload[key])
        self._update_rank(pool, rank, {k: v for k, v in event.items() if k not in ("type", "pool", "rank")})
        self._send(event)

    def memory(self, pool: str, rank: int, payload: Mapping[str, Any]) -> None:
        memory = {k: int(payload[k]) for k in _MEMORY_KEYS if isinstance(payload.get(k), (int, float))}
        self._update_rank(pool, rank, {"memory": memory})
        self._send({"type": "memory", "pool": pool, "rank": int(rank), "memory": memory})

    def _update_rank(self, pool: str, rank: int, values: dict[str, Any]) -> None:
        with self._lock:
            entry = self._pools.get(pool)
            if entry is not None:
                entry["ranks"].setdefault(str(int(rank)), {}).update(values)

    def pools_on(self, device: str) -> list[str]:
        """Ids of the pools shown that use ``device``."""
        with self._lock:
            return [pid for pid, entry in self._pools.items() if device in entry.get("devices", ())]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            pools = [{"pool": pid, **copy.deepcopy(entry)} for pid, entry in self._pools.items()]
        return {"type": "snapshot", "pools": pools}
