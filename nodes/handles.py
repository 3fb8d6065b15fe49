"""PARALLEL_MODEL: the handle a loader hands to the other nodes.

ComfyUI caches node outputs, so the loader may not run again after the workers were unloaded
(Unload node, "Free memory" button). The handle therefore keeps the load request and asks the
runtime for the model every time it is used: the same request returns the same warm pool, and
a closed one is started again.

A node that changes how the model is used without reloading it (Parallel Model Sampling, as ComfyUI's
ModelSampling* nodes patch a MODEL) returns ``handle.derive(modifier)``: the same request and pool,
plus a modifier (a frozen dataclass with ``apply(model) -> model`` and ``describe()``) that
``model()`` folds in, in order, onto the warm model.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from parallel_runtime.service.api import LoadRequest, ParallelModel

    from .context import NodeContext

PARALLEL_MODEL = "PARALLEL_MODEL"


class ModelModifier(Protocol):
    """A change to how a loaded model is used (no reload): e.g. the model sampling in force."""

    def apply(self, model: ParallelModel) -> ParallelModel: ...

    def describe(self) -> str: ...


@dataclasses.dataclass(eq=False)
class ParallelModelHandle:
    """A loaded (or reloadable) parallel model plus what the panel shows about it."""

    request: LoadRequest
    context: NodeContext
    name: str  # what the user picked, e.g. "FLUX.1-dev" or "tiny-flux"
    family: str
    devices: tuple[str, ...]
    layout: str  # e.g. "cfg=2 x ulysses=2"
    reason: str
    modifiers: tuple[ModelModifier, ...] = ()  # applied in order to the warm model by model()
    _last: Any = dataclasses.field(default=None, repr=False)  # the model returned last time

    @property
    def pool_id(self) -> str:
        """Stable id of the worker pool behind this handle (used by the status panel)."""
        return hashlib.sha1(repr((self.name, self.devices, self.layout, self.request)).encode()).hexdigest()[:10]

    def model(self, room_made: bool = False) -> ParallelModel:
        """The runtime model (warm pool reused; started again after an unload). Before workers
        start, ComfyUI's own models leave their GPUs (unless the caller just did that: ``room_made``)."""
        from parallel_runtime.errors import JobCancelled
        from parallel_runtime.service.api import load_parallel_model

        last_pool = getattr(self._last, "pool", None)
        if not room_made and not getattr(last_pool, "is_alive", False):
            self.context.bridge.free_memory_for(self.devices)
        bridge = self.context.bridge
        try:  # ComfyUI's Cancel stops a load too (a real model takes minutes)
            model = load_parallel_model(self.request, self.context.registry, self.reason, bridge.interrupted)
        except JobCancelled as exc:
            bridge.raise_interrupted(exc)
            raise
        self._last = model
        self.context.status.pool_loaded(self.pool_id, self.name, self.family, self.devices, self.layout, self.reason)
        memory = getattr(model, "info", {}).get("memory")
        if isinstance(memory, dict):  # rank 0's memory after loading (ranks report more while sampling)
            self.context.status.memory(self.pool_id, 0, memory)
        for modifier in self.modifiers:
            model = modifier.apply(model)
        return model

    def derive(self, modifier: ModelModifier) -> ParallelModelHandle:
        """A new handle on the same request and pool with ``modifier`` applied after the existing ones."""
        return dataclasses.replace(self, modifiers=(*self.modifiers, modifier), _last=None)

    def unload(self) -> None:
        """Stop this model's workers (a later use starts them again)."""
        model, self._last = self._last, None
        if model is not None:
            model.unload()
        self.context.status.pool_closed(self.pool_id)

    def __repr__(self) -> str:
        return f"ParallelModel({self.name}, {self.family}, {self.layout} on {','.join(self.devices)})"
