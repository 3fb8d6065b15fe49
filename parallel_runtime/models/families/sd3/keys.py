"""SD3 / SD3.5 files in Stability's MMDiT layout (``joint_blocks.N.x_block...``): what the weights decide of the
diffusers config, which variant, the conversion to diffusers names (diffusers' own converter) and the layout
computed back from a diffusers config (names and shapes, for LoRA files)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ... import compat
from ...layout_shapes import (
    TIMESTEP_FEATURES,
    Shapes,
    StateDict,
    add_linear,
    block_count,
    blocks_with,
    heads_of,
    shape_of,
)
from ..spec import OriginalLayout
from . import ID, SD3_MEDIUM, SD35_LARGE, SD35_MEDIUM


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels, patch, _ = shape_of(shapes, "x_embedder.proj.weight", ID)
    norm_key = "joint_blocks.0.x_block.attn.ln_q.weight"
    qk_norm = norm_key in shapes
    head_dim = shapes[norm_key][0] if qk_norm else int(base["attention_head_dim"])
    positions = shape_of(shapes, "pos_embed", ID)[1]
    side = math.isqrt(positions)
    context = shape_of(shapes, "context_embedder.weight", ID)
    return {
        "num_layers": block_count(shapes, "joint_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": heads_of(hidden, head_dim, ID),
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "final_layer.linear.weight", ID)[0] // (patch * patch),
        "patch_size": patch,
        "caption_projection_dim": context[0],
        "joint_attention_dim": context[1],
        "pooled_projection_dim": shape_of(shapes, "y_embedder.mlp.0.weight", ID)[1],
        "pos_embed_max_size": side if side * side == positions else base.get("pos_embed_max_size"),
        "dual_attention_layers": list(blocks_with(shapes, "joint_blocks.", "x_block.attn2.")),
        "qk_norm": "rms_norm" if qk_norm else None,
    }


def variant_of(shapes: Shapes) -> str:
    """SD3.5 medium (dual attention blocks), SD3.5 large (qk-norm without dual attention, or 38 blocks) or SD3 medium."""
    if blocks_with(shapes, "joint_blocks.", "x_block.attn2."):
        return SD35_MEDIUM
    if "joint_blocks.0.x_block.attn.ln_q.weight" in shapes or block_count(shapes, "joint_blocks.") >= 38:
        return SD35_LARGE
    return SD3_MEDIUM


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    return compat.convert_sd3_transformer(state)


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Stability's MMDiT layout of SD3 / SD3.5 (``joint_blocks``; the last context block is pre-only)."""
    head = int(config["attention_head_dim"])
    h = int(config["num_attention_heads"]) * head
    patch, in_channels = int(config["patch_size"]), int(config["in_channels"])
    layers = int(config["num_layers"])
    dual = set(config.get("dual_attention_layers") or ())
    qk_norm = bool(config.get("qk_norm"))
    side = int(config["pos_embed_max_size"])
    out: dict[str, tuple[int, ...]] = {"pos_embed": (1, side * side, h)}
    out["x_embedder.proj.weight"] = (h, in_channels, patch, patch)
    out["x_embedder.proj.bias"] = (h,)
    add_linear(out, "t_embedder.mlp.0", h, TIMESTEP_FEATURES)
    add_linear(out, "t_embedder.mlp.2", h, h)
    add_linear(out, "y_embedder.mlp.0", h, int(config["pooled_projection_dim"]))
    add_linear(out, "y_embedder.mlp.2", h, h)
    add_linear(
        out, "context_embedder", int(config.get("caption_projection_dim") or h), int(config["joint_attention_dim"])
    )
    for i in range(layers):
        for part in ("x_block", "context_block"):
            block = f"joint_blocks.{i}.{part}"
            pre_only = part == "context_block" and i == layers - 1
            attns = ("attn", "attn2") if part == "x_block" and i in dual else ("attn",)
            chunks = 2 if pre_only else (9 if len(attns) == 2 else 6)
            for attn in attns:
                add_linear(out, f"{block}.{attn}.qkv", 3 * h, h)
                if qk_norm:
                    out[f"{block}.{attn}.ln_q.weight"] = (head,)
                    out[f"{block}.{attn}.ln_k.weight"] = (head,)
                if not pre_only:
                    add_linear(out, f"{block}.{attn}.proj", h, h)
            add_linear(out, f"{block}.adaLN_modulation.1", chunks * h, h)
            if not pre_only:
                add_linear(out, f"{block}.mlp.fc1", 4 * h, h)
                add_linear(out, f"{block}.mlp.fc2", h, 4 * h)
    add_linear(out, "final_layer.linear", patch * patch * int(config.get("out_channels") or in_channels), h)
    add_linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out


LAYOUT = OriginalLayout("x_embedder.proj.weight", config_from_weights, variant_of, to_diffusers, skeleton)
