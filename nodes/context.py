"""NodeContext: the pool registry, bridge and status board the nodes share.

ComfyUI creates node objects itself (``NodeClass()``, no arguments) and keeps worker pools alive
between prompts only if every node finds the same registry, so one process-wide context is
unavoidable; so is one bridge (a piece of ComfyUI it lacks is reported once). They live here and
nowhere else: created on first use by ``shared_context()`` / ``shared_bridge()``; they are the
pack's only module-level mutable state. Tests (and scripts) build their own ``NodeContext``
and pass it to the node constructors instead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING

from .bridge import Bridge, ComfyBridge
from .status import StatusBoard

if TYPE_CHECKING:
    from parallel_runtime.service.api import PoolRegistry

log = logging.getLogger("dit_parallel.nodes")


@dataclasses.dataclass
class NodeContext:
    """Everything a node needs besides its inputs."""

    registry: PoolRegistry
    bridge: Bridge
    status: StatusBoard

    @classmethod
    def create(cls, registry: PoolRegistry | None = None, bridge: Bridge | None = None) -> NodeContext:
        if registry is None:
            from parallel_runtime.service.api import PoolRegistry

            registry = PoolRegistry(max_pools=2)
        bridge = bridge or shared_bridge()
        return cls(registry, bridge, StatusBoard(bridge))

    def unload_all(self) -> None:
        """Close every worker pool (frees the GPUs) and tell the panel."""
        self.registry.close_all()
        self.status.reset()
        log.info("dit-parallel: all worker pools closed")

    def unload_device(self, device: str) -> None:
        """Close the worker pools that use ``device`` (ComfyUI needs its memory)."""
        closed = [pool for pool in self.registry.pools() if device in pool.devices]
        for pool in closed:
            pool.close()
        for pool_id in self.status.pools_on(device):
            self.status.pool_closed(pool_id)
        if closed:
            log.info("dit-parallel: ComfyUI needs memory on %s: closed %d worker pool(s) there", device, len(closed))


class ContextNode:
    """Base of every node class: ComfyUI builds nodes with no arguments (they use the shared
    context); tests pass their own NodeContext."""

    def __init__(self, context: NodeContext | None = None):
        self._context = context

    @property
    def context(self) -> NodeContext:
        return self._context or shared_context()


_SHARED: NodeContext | None = None
_BRIDGE: ComfyBridge | None = None
_SHARED_LOCK = threading.Lock()


def shared_bridge() -> ComfyBridge:
    """The process-wide bridge to ComfyUI (created on first call): a piece of ComfyUI it cannot find is
    reported once per process, however many nodes ask."""
    global _BRIDGE
    with _SHARED_LOCK:
        if _BRIDGE is None:
            _BRIDGE = ComfyBridge()
        return _BRIDGE


def shared_context() -> NodeContext:
    """The process-wide context (created on first call). The workers stay warm between prompts;
    they are freed when the user frees memory in ComfyUI, or on a GPU where ComfyUI needs the
    memory they hold for its own models."""
    global _SHARED
    bridge = shared_bridge()
    with _SHARED_LOCK:
        if _SHARED is None:
            ctx = NodeContext.create(bridge=bridge)
            ctx.bridge.on_free_requested(ctx.unload_all)
            ctx.bridge.on_memory_needed(ctx.unload_device)
            _SHARED = ctx
        return _SHARED


def install_web_routes() -> None:
    """Register the panel's HTTP routes with ComfyUI's server (a no-op without ComfyUI). Called
    once from the pack's ``__init__``: ComfyUI adds routes only before its server starts."""
    shared_bridge().add_routes(lambda: shared_context().status.snapshot(), lambda: shared_context().unload_all())
