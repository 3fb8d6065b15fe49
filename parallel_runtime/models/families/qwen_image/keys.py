"""Qwen-Image files: their own names are diffusers' (diffusers' single-file mapping is the identity). What the
weights decide of the diffusers config is read from the shapes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...layout_shapes import Shapes, StateDict, block_count, heads_of, scaled_rope_axes, shape_of
from ..spec import OriginalLayout
from . import ID, QWEN_IMAGE

ANCHOR = "txt_norm.weight"


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = shape_of(shapes, "img_in.weight", ID)
    head_dim = shape_of(shapes, "transformer_blocks.0.attn.norm_q.weight", ID)[0]
    axes = base.get("axes_dims_rope") if head_dim == base.get("attention_head_dim") else scaled_rope_axes(head_dim)
    return {
        "num_layers": block_count(shapes, "transformer_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": heads_of(hidden, head_dim, ID),
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "proj_out.weight", ID)[0] // 4,
        "joint_attention_dim": shape_of(shapes, "txt_in.weight", ID)[1],
        "axes_dims_rope": list(axes),
    }


def variant_of(shapes: Shapes) -> str:
    return QWEN_IMAGE


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """The identity (converted tensors leave ``state``, as every family's conversion does)."""
    return {k: state.pop(k) for k in list(state)}


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers)
