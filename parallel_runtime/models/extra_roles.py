"""Which non-block tensors of a transformer the first PipeFusion stage (embedding) and the last one (output
layers) need: found by tracing the adapter's ``embed_full`` and ``project_out`` on a fully meta copy of the model
(shapes only, no data), recording the tensors each one touches. If tracing fails, both ends load every
non-block tensor.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .base import Conditioning, ModelAdapter
from .registry import adapter_class_for, transformer_skeleton

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ExtraRoles:
    """Names of the non-block tensors the first stage (embed) and the last stage (final) need."""

    embed: frozenset[str]
    final: frozenset[str]
    traced: bool


class _TensorUse(TorchFunctionMode):
    """Records which named tensors (by identity) are passed to torch functions."""

    def __init__(self, names: dict[int, str]):
        super().__init__()
        self.names, self.used = names, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and id(t) in self.names:
                self.used.add(self.names[id(t)])
        return func(*args, **kwargs)


def _named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def trace_extra_roles(model_cls: type, config: dict[str, Any]) -> ExtraRoles:
    """The tensors ``embed_full`` and ``project_out`` touch, found on a fully meta model."""
    with torch.device("meta"):  # buffers too; with the family's extra modules (Wan Fun-Control's ref_conv)
        skeleton = transformer_skeleton(model_cls, config)
    adapter = adapter_class_for(model_cls)(skeleton)
    names = {id(t): n for n, t in _named_tensors(skeleton).items()}
    prefixes = [p for held in held_prefixes(skeleton, adapter) for p in held]
    extras = {n for n in names.values() if not n.startswith(tuple(prefixes))}
    try:
        p = adapter.plan.patch_size
        frames = (1,) if adapter.plan.latent_dims == 3 else ()  # a video family's [B, C, T, H, W]
        x = torch.zeros(1, adapter.plan.latent_channels, *frames, 2 * p, 2 * p, device="meta")
        sizes = adapter.config_sizes(config)
        dim, pooled_dim = sizes.text_dim, sizes.pooled_dim
        cond = adapter.trace_conditioning(
            Conditioning(
                torch.zeros(1, 4, int(dim), device="meta"),
                torch.zeros(1, int(pooled_dim), device="meta") if pooled_dim else None,
            )
        )
        one = torch.zeros(1, device="meta")
        with _TensorUse(names) as embed_use:
            acts = adapter.embed_full(x, one, cond, one)
        with _TensorUse(names) as final_use:
            adapter.project_out(acts)
    except Exception as exc:  # noqa: BLE001 - any failure only costs memory: load both ends fully
        log.warning("could not trace %s's embedding/output layers (%s); both ends load them all", model_cls, exc)
        return ExtraRoles(frozenset(extras), frozenset(extras), False)
    embed = embed_use.used & extras
    final = final_use.used & extras
    unused = extras - embed - final
    return ExtraRoles(frozenset(embed | unused), frozenset(final), True)


def block_prefixes(model: nn.Module, adapter: ModelAdapter) -> list[str]:
    """State-dict prefix of every block, in execution order (index = block number)."""
    return [f"{name}.{j}." for name in adapter.plan.block_lists for j in range(len(getattr(model, name)))]


def held_prefixes(model: nn.Module, adapter: ModelAdapter) -> list[tuple[str, ...]]:
    """Per block (execution order): its own prefix and those of the modules outside the block lists that run in
    its call, what the stage holding it loads. An adapter with such modules (Wan VACE's hint blocks) names them
    in ``companion_prefixes()``: block index -> prefixes."""
    companions = adapter.companion_prefixes() if hasattr(adapter, "companion_prefixes") else {}
    return [(prefix, *companions.get(i, ())) for i, prefix in enumerate(block_prefixes(model, adapter))]
