"""FLUX.2 files in Black Forest Labs' layout (``double_blocks``, ``single_blocks``, ``double_stream_modulation_img``):
what the weights decide of the diffusers config and the conversion to diffusers names (diffusers' own converter)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import compat
from ...layout_shapes import Shapes, StateDict, block_count, heads_of, shape_of
from ..spec import OriginalLayout
from . import DEV, ID


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = shape_of(shapes, "img_in.weight", ID)
    head_dim = shape_of(shapes, "double_blocks.0.img_attn.norm.query_norm.scale", ID)[0]
    out_channels = shape_of(shapes, "final_layer.linear.weight", ID)[0]
    axes = base.get("axes_dims_rope") if head_dim == base.get("attention_head_dim") else [head_dim // 4] * 4
    return {
        "num_layers": block_count(shapes, "double_blocks."),
        "num_single_layers": block_count(shapes, "single_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": heads_of(hidden, head_dim, ID),
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "joint_attention_dim": shape_of(shapes, "txt_in.weight", ID)[1],
        "timestep_guidance_channels": shape_of(shapes, "time_in.in_layer.weight", ID)[1],
        "mlp_ratio": shape_of(shapes, "double_blocks.0.img_mlp.0.weight", ID)[0] / 2 / hidden,
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": list(axes),
    }


def variant_of(shapes: Shapes) -> str:
    return DEV


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    return compat.convert_flux2_transformer(state)


LAYOUT = OriginalLayout("img_in.weight", config_from_weights, variant_of, to_diffusers)
