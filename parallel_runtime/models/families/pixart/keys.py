"""PixArt files in PixArt's own layout (``blocks.N.attn.qkv``, ``t_block.1``, ``y_embedder.y_proj``...): what the
weights decide of the diffusers config and the conversion to diffusers names, with a rename table (diffusers ships
no single-file converter for PixArt)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from ...layout_shapes import Shapes, StateDict, block_count, heads_of, shape_of
from ..spec import OriginalLayout
from . import ID, SIGMA_1024


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels, patch, _ = shape_of(shapes, "x_embedder.proj.weight", ID)
    head_dim = int(base["attention_head_dim"])
    return {
        "num_layers": block_count(shapes, "blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": heads_of(hidden, head_dim, ID),
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "final_layer.linear.weight", ID)[0] // (patch * patch),
        "patch_size": patch,
        "caption_channels": shape_of(shapes, "y_embedder.y_proj.fc1.weight", ID)[1],
        "cross_attention_dim": hidden,
        "use_additional_conditions": "csize_embedder.mlp.0.weight" in shapes,  # PixArt-alpha 1024 micro-conditions
    }


def variant_of(shapes: Shapes) -> str:
    """PixArt Sigma 1024 (alpha's micro-conditions are decided by the weights)."""
    return SIGMA_1024


# PixArt original module -> diffusers module (tensor suffixes .weight / .bias follow).
_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "x_embedder.proj": "pos_embed.proj",
        "t_embedder.mlp.0": "adaln_single.emb.timestep_embedder.linear_1",
        "t_embedder.mlp.2": "adaln_single.emb.timestep_embedder.linear_2",
        "csize_embedder.mlp.0": "adaln_single.emb.resolution_embedder.linear_1",
        "csize_embedder.mlp.2": "adaln_single.emb.resolution_embedder.linear_2",
        "ar_embedder.mlp.0": "adaln_single.emb.aspect_ratio_embedder.linear_1",
        "ar_embedder.mlp.2": "adaln_single.emb.aspect_ratio_embedder.linear_2",
        "t_block.1": "adaln_single.linear",
        "y_embedder.y_proj.fc1": "caption_projection.linear_1",
        "y_embedder.y_proj.fc2": "caption_projection.linear_2",
        "final_layer.linear": "proj_out",
    }
)
_BLOCK_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "attn.proj": "attn1.to_out.0",
        "cross_attn.q_linear": "attn2.to_q",
        "cross_attn.proj": "attn2.to_out.0",
        "mlp.fc1": "ff.net.0.proj",
        "mlp.fc2": "ff.net.2",
    }
)
_BLOCK_FUSED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "attn.qkv": ("attn1.to_q", "attn1.to_k", "attn1.to_v"),
        "cross_attn.kv_linear": ("attn2.to_k", "attn2.to_v"),
    }
)
_UNUSED = (
    "y_embedder.y_embedding",  # the learned empty caption, used only to drop captions in training
    "pos_embed",  # the fixed sin-cos table: diffusers computes it for the image size
)
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """PixArt's original names -> diffusers' (converted tensors are removed from ``state``)."""
    out: StateDict = {}
    for key in _UNUSED:
        state.pop(key, None)
    if "final_layer.scale_shift_table" in state:
        out["scale_shift_table"] = state.pop("final_layer.scale_shift_table")
    for key in list(state):
        block = re.fullmatch(r"blocks\.(\d+)\.scale_shift_table", key)
        if block:
            out[f"transformer_blocks.{block.group(1)}.scale_shift_table"] = state.pop(key)
            continue
        module, _, kind = key.rpartition(".")
        if module in _MODULES:
            out[f"{_MODULES[module]}.{kind}"] = state.pop(key)
            continue
        match = _BLOCK.fullmatch(key)
        if match is None:
            continue
        index, inner, kind = match.groups()
        prefix = f"transformer_blocks.{index}."
        if inner in _BLOCK_MODULES:
            out[f"{prefix}{_BLOCK_MODULES[inner]}.{kind}"] = state.pop(key)
        elif inner in _BLOCK_FUSED:
            names = _BLOCK_FUSED[inner]
            for name, part in zip(names, torch.chunk(state.pop(key), len(names), dim=0)):
                out[f"{prefix}{name}.{kind}"] = part.clone()  # own aligned storage, as from_pretrained gives
    return out


LAYOUT = OriginalLayout("x_embedder.proj.weight", config_from_weights, variant_of, to_diffusers)
