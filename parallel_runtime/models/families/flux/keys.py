"""Flux.1 files in Black Forest Labs' layout (``double_blocks.N.img_attn.qkv``, ``single_blocks.N.linear1``...):
what the weights decide of the diffusers config, dev or schnell, the conversion to diffusers names (diffusers'
own converter) and the layout computed back from a diffusers config (names and shapes, for LoRA files)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ... import compat
from ...layout_shapes import (
    TIMESTEP_FEATURES,
    Shapes,
    StateDict,
    add_linear,
    block_count,
    heads_of,
    scaled_rope_axes,
    shape_of,
)
from ..spec import OriginalLayout
from . import DEV, FILL, ID, SCHNELL
from .fill import is_fill

_FLUX1_FUSED_ROWS = 7 * 3072  # q, k, v (3 x 3072) + MLP (4 x 3072): the width diffusers' converter splits at
_LINEAR1 = re.compile(r"single_blocks\.(\d+)\.linear1\.(weight|bias)")


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = shape_of(shapes, "img_in.weight", ID)
    out_channels = shape_of(shapes, "final_layer.linear.weight", ID)[0]
    head_dim = shape_of(shapes, "double_blocks.0.img_attn.norm.query_norm.scale", ID)[0]
    axes = base.get("axes_dims_rope")
    if head_dim != base.get("attention_head_dim") or axes is None:
        axes = scaled_rope_axes(head_dim)
    return {
        "num_layers": block_count(shapes, "double_blocks."),
        "num_single_layers": block_count(shapes, "single_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": heads_of(hidden, head_dim, ID),
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "joint_attention_dim": shape_of(shapes, "txt_in.weight", ID)[1],
        "pooled_projection_dim": shape_of(shapes, "vector_in.in_layer.weight", ID)[1],
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": list(axes),
    }


def variant_of(shapes: Shapes) -> str:
    """Flux Fill (img_in reads the inpainting image and mask too), dev (a guidance embedding) or schnell."""
    latent = shape_of(shapes, "final_layer.linear.weight", ID)[0] // 4
    if is_fill(shape_of(shapes, "img_in.weight", ID)[1], latent, 2):
        return FILL
    return DEV if "guidance_in.in_layer.weight" in shapes else SCHNELL


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """diffusers' Flux converter, except for the single blocks' fused q/k/v/MLP projection, which it
    splits at FLUX.1's fixed width: it gets shape-only stand-ins and the real tensors are split here
    at the width of these weights."""
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    fused = {key: state[key] for key in state if _LINEAR1.fullmatch(key)}
    for key, tensor in fused.items():
        state[key] = torch.empty((_FLUX1_FUSED_ROWS, *tensor.shape[1:]), dtype=tensor.dtype, device="meta")
    out = compat.convert_flux_transformer(state)
    for key, tensor in fused.items():
        index, kind = _LINEAR1.fullmatch(key).groups()
        q, k, v, mlp = torch.split(tensor, [hidden, hidden, hidden, tensor.shape[0] - 3 * hidden])
        block = f"single_transformer_blocks.{index}."
        for name, part in (("attn.to_q", q), ("attn.to_k", k), ("attn.to_v", v), ("proj_mlp", mlp)):
            out[f"{block}{name}.{kind}"] = part.clone()  # own aligned storage, as from_pretrained gives
    return out


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Black Forest Labs' Flux.1 layout (``double_blocks``, ``single_blocks``) of a diffusers config."""
    head = int(config["attention_head_dim"])
    h = int(config["num_attention_heads"]) * head
    mlp = 4 * h
    in_channels = int(config["in_channels"])
    out: dict[str, tuple[int, ...]] = {}
    add_linear(out, "img_in", h, in_channels)
    add_linear(out, "time_in.in_layer", h, TIMESTEP_FEATURES)
    add_linear(out, "time_in.out_layer", h, h)
    add_linear(out, "vector_in.in_layer", h, int(config["pooled_projection_dim"]))
    add_linear(out, "vector_in.out_layer", h, h)
    if config.get("guidance_embeds"):
        add_linear(out, "guidance_in.in_layer", h, TIMESTEP_FEATURES)
        add_linear(out, "guidance_in.out_layer", h, h)
    add_linear(out, "txt_in", h, int(config["joint_attention_dim"]))
    add_blocks(out, config, h, head, mlp, modulated=True)
    add_linear(out, "final_layer.linear", int(config.get("out_channels") or in_channels), h)
    add_linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out


def add_blocks(
    out: dict[str, tuple[int, ...]], config: Mapping[str, Any], h: int, head: int, mlp: int, modulated: bool
) -> None:
    """The shapes of the double and single blocks (``modulated``: each block has its own modulation Linear, as
    in Flux; Chroma's blocks take theirs from the distilled guidance)."""
    for i in range(int(config["num_layers"])):
        for stream in ("img", "txt"):
            block = f"double_blocks.{i}.{stream}"
            if modulated:
                add_linear(out, f"{block}_mod.lin", 6 * h, h)
            add_linear(out, f"{block}_attn.qkv", 3 * h, h)
            out[f"{block}_attn.norm.query_norm.scale"] = (head,)
            out[f"{block}_attn.norm.key_norm.scale"] = (head,)
            add_linear(out, f"{block}_attn.proj", h, h)
            add_linear(out, f"{block}_mlp.0", mlp, h)
            add_linear(out, f"{block}_mlp.2", h, mlp)
    for i in range(int(config["num_single_layers"])):
        block = f"single_blocks.{i}"
        add_linear(out, f"{block}.linear1", 3 * h + mlp, h)
        add_linear(out, f"{block}.linear2", h, h + mlp)
        out[f"{block}.norm.query_norm.scale"] = (head,)
        out[f"{block}.norm.key_norm.scale"] = (head,)
        if modulated:
            add_linear(out, f"{block}.modulation.lin", 3 * h, h)


LAYOUT = OriginalLayout("img_in.weight", config_from_weights, variant_of, to_diffusers, skeleton)
