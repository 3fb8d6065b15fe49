"""The original key layouts of single-file transformers and their conversion to diffusers.

Black Forest Labs' Flux.1 files (``double_blocks.N.img_attn.qkv``...), Stability's MMDiT files for
SD3 / SD3.5 (``joint_blocks.N.x_block...``) and PixArt's own checkpoints (``blocks.N.attn.qkv``...)
name their tensors differently from diffusers. This module reads from those names and shapes what
the weights decide about a diffusers config (depth, width, heads where the weights show them,
channels, text widths, optional parts), tells the published variants apart, and converts a state
dict to diffusers names: with diffusers' own converters for Flux and SD3, and with a rename table
for PixArt, for which diffusers ships no single-file converter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from ..errors import ConfigError
from . import compat, wan_layout

Shapes = Mapping[str, tuple[int, ...]]
StateDict = dict[str, torch.Tensor]

# A tensor every transformer of the family has, in its original layout (diffusers layouts lack it).
ANCHOR_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "flux": "img_in.weight",
        "sd3": "x_embedder.proj.weight",
        "pixart": "x_embedder.proj.weight",
        "qwen-image": "txt_norm.weight",  # Qwen-Image's own names are diffusers' (the identity conversion)
        "flux2": "img_in.weight",
        "wan": wan_layout.ANCHOR,
    }
)


# -- reading shapes ---------------------------------------------------------------------------------
def _shape(shapes: Shapes, key: str, family: str) -> tuple[int, ...]:
    if key not in shapes:
        raise ConfigError(
            f"the {family} file has no tensor {key!r}",
            f"every {family} transformer in its original layout has it; the file is incomplete or another model",
            "use the complete transformer file as published (or a diffusers folder)",
        )
    return tuple(shapes[key])


def block_count(shapes: Shapes, prefix: str) -> int:
    """Number of blocks ``prefix<N>.`` (highest index + 1)."""
    indices = {k[len(prefix) :].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    numbers = [int(i) for i in indices if i.isdigit()]
    return max(numbers) + 1 if numbers else 0


def _blocks_with(shapes: Shapes, prefix: str, part: str) -> tuple[int, ...]:
    """Indices of the blocks ``prefix<N>.`` that hold a tensor starting with ``part``."""
    found = set()
    for key in shapes:
        if key.startswith(prefix):
            index, _, rest = key[len(prefix) :].partition(".")
            if index.isdigit() and rest.startswith(part):
                found.add(int(index))
    return tuple(sorted(found))


def _heads(hidden: int, head_dim: int, family: str) -> int:
    if head_dim <= 0 or hidden % head_dim:
        raise ConfigError(
            f"the {family} weights are {hidden} wide, which does not split into heads of {head_dim}",
            "the weights do not store the head count of this family; it follows from the head width",
            "pass overrides={'attention_head_dim': <head width>} (e.g. 64 or 72) for this file",
        )
    return hidden // head_dim


def flux_rope_axes(head_dim: int) -> tuple[int, int, int]:
    """Flux's rotary split of a head over (index, row, column): FLUX.1's (16, 56, 56) for 128,
    scaled the same way for other head widths (each part even)."""
    side = (head_dim * 7 // 16) // 2 * 2
    return (head_dim - 2 * side, side, side)


# -- what the weights decide -----------------------------------------------------------------------
def flux_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = _shape(shapes, "img_in.weight", "flux")
    out_channels = _shape(shapes, "final_layer.linear.weight", "flux")[0]
    head_dim = _shape(shapes, "double_blocks.0.img_attn.norm.query_norm.scale", "flux")[0]
    axes = base.get("axes_dims_rope")
    if head_dim != base.get("attention_head_dim") or axes is None:
        axes = flux_rope_axes(head_dim)
    return {
        "num_layers": block_count(shapes, "double_blocks."),
        "num_single_layers": block_count(shapes, "single_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": _heads(hidden, head_dim, "flux"),
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "joint_attention_dim": _shape(shapes, "txt_in.weight", "flux")[1],
        "pooled_projection_dim": _shape(shapes, "vector_in.in_layer.weight", "flux")[1],
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": list(axes),
    }


def sd3_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels, patch, _ = _shape(shapes, "x_embedder.proj.weight", "sd3")
    norm_key = "joint_blocks.0.x_block.attn.ln_q.weight"
    qk_norm = norm_key in shapes
    head_dim = shapes[norm_key][0] if qk_norm else int(base["attention_head_dim"])
    positions = _shape(shapes, "pos_embed", "sd3")[1]
    side = math.isqrt(positions)
    context = _shape(shapes, "context_embedder.weight", "sd3")
    return {
        "num_layers": block_count(shapes, "joint_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": _heads(hidden, head_dim, "sd3"),
        "in_channels": in_channels,
        "out_channels": _shape(shapes, "final_layer.linear.weight", "sd3")[0] // (patch * patch),
        "patch_size": patch,
        "caption_projection_dim": context[0],
        "joint_attention_dim": context[1],
        "pooled_projection_dim": _shape(shapes, "y_embedder.mlp.0.weight", "sd3")[1],
        "pos_embed_max_size": side if side * side == positions else base.get("pos_embed_max_size"),
        "dual_attention_layers": list(_blocks_with(shapes, "joint_blocks.", "x_block.attn2.")),
        "qk_norm": "rms_norm" if qk_norm else None,
    }


def pixart_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels, patch, _ = _shape(shapes, "x_embedder.proj.weight", "pixart")
    head_dim = int(base["attention_head_dim"])
    return {
        "num_layers": block_count(shapes, "blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": _heads(hidden, head_dim, "pixart"),
        "in_channels": in_channels,
        "out_channels": _shape(shapes, "final_layer.linear.weight", "pixart")[0] // (patch * patch),
        "patch_size": patch,
        "caption_channels": _shape(shapes, "y_embedder.y_proj.fc1.weight", "pixart")[1],
        "cross_attention_dim": hidden,
        "use_additional_conditions": "csize_embedder.mlp.0.weight" in shapes,  # PixArt-alpha 1024 micro-conditions
    }


def qwen_image_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = _shape(shapes, "img_in.weight", "qwen-image")
    head_dim = _shape(shapes, "transformer_blocks.0.attn.norm_q.weight", "qwen-image")[0]
    axes = base.get("axes_dims_rope") if head_dim == base.get("attention_head_dim") else flux_rope_axes(head_dim)
    return {
        "num_layers": block_count(shapes, "transformer_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": _heads(hidden, head_dim, "qwen-image"),
        "in_channels": in_channels,
        "out_channels": _shape(shapes, "proj_out.weight", "qwen-image")[0] // 4,
        "joint_attention_dim": _shape(shapes, "txt_in.weight", "qwen-image")[1],
        "axes_dims_rope": list(axes),
    }


def flux2_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = _shape(shapes, "img_in.weight", "flux2")
    head_dim = _shape(shapes, "double_blocks.0.img_attn.norm.query_norm.scale", "flux2")[0]
    out_channels = _shape(shapes, "final_layer.linear.weight", "flux2")[0]
    axes = base.get("axes_dims_rope") if head_dim == base.get("attention_head_dim") else [head_dim // 4] * 4
    return {
        "num_layers": block_count(shapes, "double_blocks."),
        "num_single_layers": block_count(shapes, "single_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": _heads(hidden, head_dim, "flux2"),
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "joint_attention_dim": _shape(shapes, "txt_in.weight", "flux2")[1],
        "timestep_guidance_channels": _shape(shapes, "time_in.in_layer.weight", "flux2")[1],
        "mlp_ratio": _shape(shapes, "double_blocks.0.img_mlp.0.weight", "flux2")[0] / 2 / hidden,
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": list(axes),
    }


CONFIG_FROM_WEIGHTS: Mapping[str, Callable[[Shapes, Mapping[str, Any]], dict[str, Any]]] = MappingProxyType(
    {
        "flux": flux_config,
        "sd3": sd3_config,
        "pixart": pixart_config,
        "qwen-image": qwen_image_config,
        "flux2": flux2_config,
        "wan": wan_layout.wan_config,
    }
)


# -- published variants ------------------------------------------------------------------------------
def detect_variant(family: str, shapes: Shapes) -> str:
    """Which shipped config fits: Flux dev (guidance embedding) or schnell; SD3.5 medium (dual
    attention blocks), SD3.5 large (qk-norm without dual attention, or 38 blocks) or SD3 medium;
    PixArt Sigma 1024 (alpha's micro-conditions are decided by the weights)."""
    if family == "flux":
        return "flux-dev" if "guidance_in.in_layer.weight" in shapes else "flux-schnell"
    if family in ("qwen-image", "flux2"):
        return {"qwen-image": "qwen-image", "flux2": "flux2-dev"}[family]
    if family == "sd3":
        if _blocks_with(shapes, "joint_blocks.", "x_block.attn2."):
            return "sd3.5-medium"
        if "joint_blocks.0.x_block.attn.ln_q.weight" in shapes or block_count(shapes, "joint_blocks.") >= 38:
            return "sd3.5-large"
        return "sd3-medium"
    if family == "wan":
        return wan_layout.wan_variant(shapes)
    return "pixart-sigma-1024"


# -- conversion to diffusers names -------------------------------------------------------------------
_FLUX1_FUSED_ROWS = 7 * 3072  # q, k, v (3 x 3072) + MLP (4 x 3072): the width diffusers' converter splits at
_FLUX_LINEAR1 = re.compile(r"single_blocks\.(\d+)\.linear1\.(weight|bias)")


def _flux_to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """diffusers' Flux converter, except for the single blocks' fused q/k/v/MLP projection, which it
    splits at FLUX.1's fixed width: it gets shape-only stand-ins and the real tensors are split here
    at the width of these weights."""
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    fused = {key: state[key] for key in state if _FLUX_LINEAR1.fullmatch(key)}
    for key, tensor in fused.items():
        state[key] = torch.empty((_FLUX1_FUSED_ROWS, *tensor.shape[1:]), dtype=tensor.dtype, device="meta")
    out = compat.convert_flux_transformer(state)
    for key, tensor in fused.items():
        index, kind = _FLUX_LINEAR1.fullmatch(key).groups()
        q, k, v, mlp = torch.split(tensor, [hidden, hidden, hidden, tensor.shape[0] - 3 * hidden])
        block = f"single_transformer_blocks.{index}."
        for name, part in (("attn.to_q", q), ("attn.to_k", k), ("attn.to_v", v), ("proj_mlp", mlp)):
            out[f"{block}{name}.{kind}"] = part.clone()  # own aligned storage, as from_pretrained gives
    return out


def _sd3_to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    return compat.convert_sd3_transformer(state)


# PixArt original module -> diffusers module (tensor suffixes .weight / .bias follow).
_PIXART_MODULES: Mapping[str, str] = MappingProxyType(
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
_PIXART_BLOCK_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "attn.proj": "attn1.to_out.0",
        "cross_attn.q_linear": "attn2.to_q",
        "cross_attn.proj": "attn2.to_out.0",
        "mlp.fc1": "ff.net.0.proj",
        "mlp.fc2": "ff.net.2",
    }
)
_PIXART_BLOCK_FUSED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "attn.qkv": ("attn1.to_q", "attn1.to_k", "attn1.to_v"),
        "cross_attn.kv_linear": ("attn2.to_k", "attn2.to_v"),
    }
)
_PIXART_UNUSED = (
    "y_embedder.y_embedding",  # the learned empty caption, used only to drop captions in training
    "pos_embed",  # the fixed sin-cos table: diffusers computes it for the image size
)
_PIXART_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")


def _pixart_to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """PixArt's original names -> diffusers' (converted tensors are removed from ``state``)."""
    out: StateDict = {}
    for key in _PIXART_UNUSED:
        state.pop(key, None)
    if "final_layer.scale_shift_table" in state:
        out["scale_shift_table"] = state.pop("final_layer.scale_shift_table")
    for key in list(state):
        block = re.fullmatch(r"blocks\.(\d+)\.scale_shift_table", key)
        if block:
            out[f"transformer_blocks.{block.group(1)}.scale_shift_table"] = state.pop(key)
            continue
        module, _, kind = key.rpartition(".")
        if module in _PIXART_MODULES:
            out[f"{_PIXART_MODULES[module]}.{kind}"] = state.pop(key)
            continue
        match = _PIXART_BLOCK.fullmatch(key)
        if match is None:
            continue
        index, inner, kind = match.groups()
        prefix = f"transformer_blocks.{index}."
        if inner in _PIXART_BLOCK_MODULES:
            out[f"{prefix}{_PIXART_BLOCK_MODULES[inner]}.{kind}"] = state.pop(key)
        elif inner in _PIXART_BLOCK_FUSED:
            names = _PIXART_BLOCK_FUSED[inner]
            for name, part in zip(names, torch.chunk(state.pop(key), len(names), dim=0)):
                out[f"{prefix}{name}.{kind}"] = part.clone()  # own aligned storage, as from_pretrained gives
    return out


def _same_names(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """Qwen-Image files use diffusers' names (diffusers' own single-file mapping is the identity)."""
    return {k: state.pop(k) for k in list(state)}


def _flux2_to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    return compat.convert_flux2_transformer(state)


_CONVERTERS: Mapping[str, Callable[[StateDict, Mapping[str, Any]], StateDict]] = MappingProxyType(
    {
        "flux": _flux_to_diffusers,
        "sd3": _sd3_to_diffusers,
        "pixart": _pixart_to_diffusers,
        "qwen-image": _same_names,
        "flux2": _flux2_to_diffusers,
        "wan": wan_layout.wan_to_diffusers,
    }
)


def to_diffusers(family: str, state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """Convert an original-layout state dict to diffusers names. Converted tensors are removed from
    ``state``; what is left there afterwards was not recognised."""
    return _CONVERTERS[family](state, config)
