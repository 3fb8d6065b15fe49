"""What HiDream adds to the shared Conditioning: the Llama-3.1 hidden states (``Conditioning.extras``).

The shared fields hold T5-XXL's states (``prompt_embeds`` [B, T, 4096]) and CLIP-L + CLIP-G's pooled outputs
side by side (``pooled`` [B, 2048]); :class:`HiDreamText` holds the Llama-3.1 states of every layer
[B, layers, L, 4096] (ComfyUI's ``conditioning_llama3``: batch first, then the layer; diffusers' pipeline
stacks the layer first). Block ``k`` reads layer ``config.llama_layers[k]``.
"""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras


@dataclasses.dataclass(frozen=True)
class HiDreamText(ConditioningExtras):
    """Llama-3.1's hidden states of every layer, batch first: [B, layers, L, D]."""

    llama3: torch.Tensor | None = None


def llama_states(cond: Conditioning, layers_needed: int) -> torch.Tensor:
    """The Llama-3.1 states ``cond`` carries ([B, layers, L, D]); a clear error when they are missing or hold
    fewer layers than the blocks read."""
    extras = cond.extras
    states = extras.llama3 if isinstance(extras, HiDreamText) else None
    if states is None:
        raise ConfigError(
            "a HiDream model was given conditioning without Llama-3.1 hidden states",
            "every HiDream block attends to one Llama-3.1 layer's states besides T5's (conditioning_llama3)",
            "encode the prompt with ComfyUI's QuadrupleCLIPLoader (clip_l, clip_g, t5xxl, llama 3.1) and "
            "CLIPTextEncode",
        )
    if states.ndim != 4 or states.shape[1] < layers_needed:
        raise ConfigError(
            f"HiDream's Llama-3.1 states have shape {tuple(states.shape)}",
            f"the model reads layers up to {layers_needed - 1} of [batch, layers, tokens, width] states",
            "encode the prompt with the Llama-3.1 8B text encoder HiDream uses (QuadrupleCLIPLoader)",
        )
    return states
