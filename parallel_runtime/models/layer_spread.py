"""A loaded text model spread over several GPUs by layers, as ``from_pretrained(device_map="auto",
max_memory=...)`` spreads a diffusers folder's encoder (``models.loading``): accelerate plans whole decoder
layers in order onto the GPUs within each one's byte budget and moves activations between them, the
outputs coming back to the first GPU. Used for a text encoder read from ONE file (``qwen_2.5_vl_7b*``)
that is larger than what any single GPU has left."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..errors import ConfigError


def _ordinal(device: str) -> int:
    d = torch.device(device)
    if d.type != "cuda" or d.index is None:
        raise ConfigError(
            f"text-encoder layers placed on {device!r}",
            "only GPUs (cuda:N) take a share of a text encoder's layers",
            "give a {'cuda:N': bytes} budget per GPU",
        )
    return d.index


def layer_device_map(model: nn.Module, budget: Mapping[str, int]) -> dict[str, str]:
    """Module name -> "cuda:N" for ``model``'s parameters (at their current dtypes), whole decoder layers in
    order, at most ``budget[gpu]`` bytes on each GPU (accelerate's plan, as ``device_map="auto"``)."""
    from accelerate import infer_auto_device_map

    ordinals = {_ordinal(d): d for d in budget}
    memory: dict[int | str, int] = {_ordinal(d): int(b) for d, b in budget.items()}
    memory["cpu"] = 0
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    plan = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split)
    off = sorted({str(v) for v in plan.values() if not isinstance(v, int)})
    if off:
        need = sum(p.numel() * p.element_size() for p in model.parameters())
        raise ConfigError(
            f"the text encoder ({need / 1e9:.2f} GB) does not fit the GPUs' free memory "
            f"({sum(budget.values()) / 1e9:.2f} GB over {len(budget)} GPUs)",
            f"its layers would have to go to {', '.join(off)}, which this engine does not offload to",
            "use an fp8 or GGUF text-encoder file, more GPUs, or encode with ComfyUI's CLIPLoader + CLIPTextEncode",
        )
    return {name: ordinals[index] for name, index in plan.items()}


def spread_by_layers(model: nn.Module, budget: Mapping[str, int]) -> nn.Module:
    """``model`` (loaded on the CPU) moved onto the GPUs of ``budget`` by :func:`layer_device_map`, with
    accelerate's hooks carrying the activations from layer to layer."""
    from accelerate import dispatch_model

    device_map = layer_device_map(model, budget)
    first = next(iter(device_map.values()))
    return dispatch_model(model, device_map=device_map, main_device=first)
