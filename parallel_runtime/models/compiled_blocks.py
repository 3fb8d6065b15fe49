"""Compiled blocks: regional ``torch.compile`` of the transformer blocks (the loader's ``compile = blocks``).

Every block is compiled in place (``nn.Module.compile``, static shapes): blocks of one kind share their code,
so torch compiles one graph per kind of block and input shape and every block of that kind reuses it (the
way diffusers' regional compilation works). The compiled code lives in the blocks, so a warm pool keeps it
from one prompt to the next; a new seed or prompt of the same shape compiles nothing.

Attention inside a compiled block cannot be routed by hooks added per call (compiled code would keep the
first call's hooks). So the self/joint attention modules get two permanent hooks that tell an
:class:`AttentionRouter` which module runs; while the router is active (sequence parallelism, PipeFusion's
stale K/V, a kernel other than plain SDPA) it sends that module's ``scaled_dot_product_attention`` to the
attention the caller picked for the module, outside the compiled graph (a graph break: each block kind then
compiles as a few graphs around its attention calls, still shared by every block of the kind). At one rank
with plain SDPA the router stays off and the attention is part of the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError
from .base import Activations, ModelAdapter

COMPILE_MODES = ("off", "blocks")
RECOMPILE_LIMIT = 64  # compiled variants per code object: block kinds x shapes (torch's default of 8 is too few)

AttentionFor = Callable[[nn.Module], Callable[..., torch.Tensor]]  # attention module -> its sdpa replacement


class AttentionRouter(TorchFunctionMode):
    """Sends the scaled_dot_product_attention of the attention module running now to ``resolve(module)``."""

    def __init__(self) -> None:
        super().__init__()
        self.module: nn.Module | None = None  # set by the modules' hooks while they run
        self.resolve: AttentionFor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self.module is not None:
            return self._route(*args, **kwargs)
        if func is torch.Tensor.unflatten:  # its Python method calls super(), which compiled code cannot follow
            return torch.unflatten(*args, **kwargs)  # the same op: no graph break in the middle of a block
        return func(*args, **kwargs)

    @torch.compiler.disable
    def _route(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert self.resolve is not None and self.module is not None
        return self.resolve(self.module)(*args, **kwargs)


class CompiledBlocks:
    """The compiled blocks of one adapter and the router of their attention."""

    def __init__(self, adapter: ModelAdapter):
        _raise_recompile_limit()
        self.router = AttentionRouter()
        self._handles: list[Any] = []
        self._blocks: list[nn.Module] = []
        for i in range(adapter.num_blocks):
            name, block = adapter.block(i)
            for module in adapter.self_attention_modules(name, block):
                self._handles.append(module.register_forward_pre_hook(self._entering))
                # (not always_call: compiled code would then tell the modules apart by their hook ids and
                # compile every block separately; a block that raised is reset by call() instead)
                self._handles.append(module.register_forward_hook(self._leaving))
            block.compile(dynamic=False)
            self._blocks.append(block)

    def _entering(self, module: nn.Module, args: Any) -> None:
        self.router.module = module

    def _leaving(self, module: nn.Module, args: Any, output: Any) -> None:
        self.router.module = None

    def call(
        self, adapter: ModelAdapter, name: str, block: nn.Module, acts: Activations, attention_for: AttentionFor | None
    ) -> Activations:
        """The compiled block on ``acts``; ``attention_for`` picks each self/joint attention module's attention
        (None: plain scaled_dot_product_attention, compiled with the block)."""
        self.router.module = None
        if attention_for is None:
            return adapter.call_block(name, block, acts)
        self.router.resolve = attention_for
        try:
            with self.router:
                return adapter.call_block(name, block, acts)
        finally:
            self.router.resolve = None

    def remove(self) -> None:
        """Back to eager blocks (the hooks removed, the compiled code dropped)."""
        for handle in self._handles:
            handle.remove()
        for block in self._blocks:
            block._compiled_call_impl = None
        self._handles, self._blocks = [], []


def set_compiled_blocks(adapter: ModelAdapter, mode: str) -> None:
    """Compile ``adapter``'s blocks (``"blocks"``) or run them eagerly (``"off"``); nothing changes when they
    already are."""
    check_compile_mode(mode)
    compiled = adapter.compiled
    if mode == "off" and isinstance(compiled, CompiledBlocks):
        compiled.remove()
        adapter.compiled = None
    elif mode == "blocks" and compiled is None:
        adapter.compiled = CompiledBlocks(adapter)


def check_compile_mode(mode: str) -> str:
    if mode not in COMPILE_MODES:
        raise ConfigError(
            f"compile={mode!r}",
            "the loader runs the blocks eagerly (off) or compiles each kind of block once (blocks)",
            f"use one of {', '.join(COMPILE_MODES)}",
        )
    return mode


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


def compile_counters() -> dict[str, int]:
    """torch's compile counters of this process: graphs compiled and frames it compiled (for tests and benches)."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]), "frames": int(counters["frames"]["ok"])}
