"""HiDream-I1 single files (``hidream_i1_full_fp16.safetensors`` and the like in models/diffusion_models): the
release names its tensors as diffusers does (``double_stream_blocks.N.block.attn1.to_q``, ``caption_projection.N``,
``t_embedder``...; diffusers' single-file converter only drops ComfyUI's ``model.diffusion_model.`` prefix, which
the loader removes first), so the conversion is the identity. What the weights decide of the config: width,
blocks, experts, channels and the text widths. They do not show the head width, the rotary split or which Llama
layer each block reads: the published model's (128-wide heads split 64/32/32, blocks 0-31 read layers 0-31 and the
rest layer 31) where the width allows, else 16-wide heads split 8/4/4 (narrow test files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...layout_shapes import Shapes, StateDict, block_count, heads_of, shape_of
from ..spec import OriginalLayout
from . import HIDREAM_I1, ID

DOUBLE, SINGLE = "double_stream_blocks.", "single_stream_blocks."
LLAMA_LAYERS = 32  # Llama-3.1 8B's layers; block k reads layer min(k, 31)
NARROW_HEAD = 16


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    width, patch_in = shape_of(shapes, "x_embedder.proj.weight", ID)
    patch_out = shape_of(shapes, "final_layer.linear.weight", ID)[0]
    head = int(base.get("attention_head_dim", 128))
    axes = list(base.get("axes_dims_rope", (64, 32, 32)))
    if width % head:
        head, axes = NARROW_HEAD, [NARROW_HEAD // 2, NARROW_HEAD // 4, NARROW_HEAD // 4]
    doubles, singles = block_count(shapes, DOUBLE), block_count(shapes, SINGLE)
    blocks = doubles + singles
    llama = shape_of(shapes, "caption_projection.0.linear.weight", ID)[1]
    t5 = shape_of(shapes, f"caption_projection.{blocks}.linear.weight", ID)[1]
    patch = int(base.get("patch_size", 2))
    return {
        "num_layers": doubles,
        "num_single_layers": singles,
        "attention_head_dim": head,
        "num_attention_heads": heads_of(width, head, ID),
        "axes_dims_rope": axes,
        "in_channels": patch_in // (patch * patch),
        "out_channels": patch_out // (patch * patch),
        "caption_channels": [t5, llama],
        "text_emb_dim": shape_of(shapes, "p_embedder.pooled_embedder.linear_1.weight", ID)[1],
        "num_routed_experts": block_count(shapes, f"{DOUBLE}0.block.ff_i.experts."),
        "llama_layers": [min(k, LLAMA_LAYERS - 1) for k in range(blocks)],
    }


def variant_of(shapes: Shapes) -> str:
    """Full, Dev and Fast share one architecture."""
    return HIDREAM_I1


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """The release's names are diffusers' own: every tensor moves as it is."""
    out = dict(state)
    state.clear()
    return out


LAYOUT = OriginalLayout("caption_projection.0.linear.weight", config_from_weights, variant_of, to_diffusers)
