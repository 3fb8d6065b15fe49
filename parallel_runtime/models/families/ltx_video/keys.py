"""LTX-Video 0.9 transformers in their original layout (Lightricks' names, which ComfyUI's files keep).

``ltx-video-2b-v0.9*.safetensors`` holds the transformer under ``model.diffusion_model.`` (the single-file loader
strips it) and the VAE under ``vae.`` in the same file (not read with the transformer). Lightricks' names differ
from diffusers' by four renames only (``patchify_proj`` -> ``proj_in``, ``adaln_single`` -> ``time_embed``,
``q_norm`` / ``k_norm`` -> ``norm_q`` / ``norm_k``), so a PipeFusion stage reads only its tensors and LoRA files in
this layout are routed tensor by tensor. What the weights decide is read from the shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...layout_shapes import Shapes, block_count, shape_of
from ..spec import OriginalLayout
from . import ID, LTXV_2B

ANCHOR = "patchify_proj.weight"  # diffusers' single-file detection marker too
HEADS = 32  # every LTX-Video 0.9 model's; the weights cannot show it (q/k norms span all heads): ComfyUI assumes it
RENAMES = (("patchify_proj.", "proj_in."), ("adaln_single.", "time_embed."), (".q_norm.", ".norm_q."),
           (".k_norm.", ".norm_k."))  # fmt: skip


def to_diffusers_name(name: str) -> str:
    for original, diffusers in RENAMES:
        name = name.replace(original, diffusers) if original.startswith(".") or name.startswith(original) else name
    return name


def to_original_name(name: str) -> str:
    for original, diffusers in RENAMES:
        if diffusers.startswith("."):
            name = name.replace(diffusers, original)
        elif name.startswith(diffusers):
            name = original + name[len(diffusers) :]
    return name


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    width, in_channels = shape_of(shapes, "patchify_proj.weight", ID)
    head_dim = width // HEADS
    return {
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "proj_out.weight", ID)[0],
        "num_attention_heads": HEADS,
        "attention_head_dim": head_dim,
        "num_layers": block_count(shapes, "transformer_blocks."),
        "cross_attention_dim": shape_of(shapes, "transformer_blocks.0.attn2.to_k.weight", ID)[1],
        "caption_channels": shape_of(shapes, "caption_projection.linear_1.weight", ID)[1],
    }


def variant_of(shapes: Shapes) -> str:
    return LTXV_2B


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {to_diffusers_name(name): state.pop(name) for name in list(state) if not name.startswith("vae.")}


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    from diffusers import LTXVideoTransformer3DModel

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        model = LTXVideoTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    return {to_original_name(k): tuple(v.shape) for k, v in model.state_dict().items()}


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers, skeleton)
