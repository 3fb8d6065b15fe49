"""Chroma files in their original layout, the one ComfyUI reads (``double_blocks.N.img_attn.qkv``,
``single_blocks.N.linear1``, ``distilled_guidance_layer.layers.N.in_layer``...): what the weights decide of the
diffusers config, the conversion to diffusers names (renames and row cuts only, at the width of the weights;
diffusers' own converter assumes Chroma1's width) and the layout computed back from a diffusers config
(names and shapes, for LoRA files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...layout_shapes import Shapes, StateDict, add_linear, block_count, heads_of, scaled_rope_axes, shape_of
from ..flux.keys import add_blocks
from ..spec import OriginalLayout
from . import CHROMA1, ID

GUIDE = "distilled_guidance_layer"
MLP_RATIO = 4
_DOUBLE_NAMES = (  # (original, diffusers) inside double_blocks.N / transformer_blocks.N, besides q/k/v
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    ("img_attn.proj", "attn.to_out.0"),
    ("txt_attn.proj", "attn.to_add_out"),
    ("img_mlp.0", "ff.net.0.proj"),
    ("img_mlp.2", "ff.net.2"),
    ("txt_mlp.0", "ff_context.net.0.proj"),
    ("txt_mlp.2", "ff_context.net.2"),
)
_SINGLE_NAMES = (
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
    ("linear2", "proj_out"),
)
_QKV = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"), "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}  # fmt: skip


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    hidden, in_channels = shape_of(shapes, "img_in.weight", ID)
    out_channels = shape_of(shapes, "final_layer.linear.weight", ID)[0]
    head_dim = shape_of(shapes, "double_blocks.0.img_attn.norm.query_norm.scale", ID)[0]
    guide_hidden, guide_in = shape_of(shapes, f"{GUIDE}.in_proj.weight", ID)
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
        "axes_dims_rope": list(axes),
        "approximator_num_channels": guide_in,
        "approximator_hidden_dim": guide_hidden,
        "approximator_layers": block_count(shapes, f"{GUIDE}.layers."),
    }


def variant_of(shapes: Shapes) -> str:
    """Every published Chroma shares one architecture."""
    return CHROMA1


def _take(state: StateDict, out: StateDict, src: str, dst: str) -> None:
    """Move ``src`` (a tensor, or a module's weight and bias) to ``dst``."""
    if src in state:
        out[dst] = state.pop(src)
        return
    for kind in ("weight", "bias"):
        if f"{src}.{kind}" in state:
            out[f"{dst}.{kind}"] = state.pop(f"{src}.{kind}")


def _split(state: StateDict, out: StateDict, src: str, parts: Mapping[str, int]) -> None:
    """Cut the rows of ``src``'s weight and bias into ``parts`` (diffusers name -> rows), in order."""
    for kind in ("weight", "bias"):
        tensor, start = state.pop(f"{src}.{kind}"), 0
        for name, rows in parts.items():
            out[f"{name}.{kind}"] = tensor[start : start + rows]
            start += rows


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    out: StateDict = {}
    for src, dst in (("img_in", "x_embedder"), ("txt_in", "context_embedder"), ("final_layer.linear", "proj_out")):
        _take(state, out, src, dst)
    for part in ("in_proj", "out_proj"):
        _take(state, out, f"{GUIDE}.{part}", f"{GUIDE}.{part}")
    for i in range(int(config["approximator_layers"])):
        _take(state, out, f"{GUIDE}.layers.{i}.in_layer", f"{GUIDE}.layers.{i}.linear_1")
        _take(state, out, f"{GUIDE}.layers.{i}.out_layer", f"{GUIDE}.layers.{i}.linear_2")
        _take(state, out, f"{GUIDE}.norms.{i}.scale", f"{GUIDE}.norms.{i}.weight")
    for i in range(int(config["num_layers"])):
        src, dst = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for fused, names in _QKV.items():
            _split(state, out, src + fused, {dst + n: hidden for n in names})
        for a, b in _DOUBLE_NAMES:
            _take(state, out, src + a, dst + b)
    for i in range(int(config["num_single_layers"])):
        src, dst = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        names = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
        rows = (hidden, hidden, hidden, MLP_RATIO * hidden)
        _split(state, out, src + "linear1", {dst + n: r for n, r in zip(names, rows)})
        for a, b in _SINGLE_NAMES:
            _take(state, out, src + a, dst + b)
    return out


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The original layout (``double_blocks``, ``single_blocks``, ``distilled_guidance_layer``) of a diffusers config."""
    head = int(config["attention_head_dim"])
    h = int(config["num_attention_heads"]) * head
    mlp, guide = MLP_RATIO * h, int(config["approximator_hidden_dim"])
    in_channels = int(config["in_channels"])
    out: dict[str, tuple[int, ...]] = {}
    add_linear(out, "img_in", h, in_channels)
    add_linear(out, "txt_in", h, int(config["joint_attention_dim"]))
    add_linear(out, f"{GUIDE}.in_proj", guide, int(config["approximator_num_channels"]))
    for i in range(int(config["approximator_layers"])):
        add_linear(out, f"{GUIDE}.layers.{i}.in_layer", guide, guide)
        add_linear(out, f"{GUIDE}.layers.{i}.out_layer", guide, guide)
        out[f"{GUIDE}.norms.{i}.scale"] = (guide,)
    add_linear(out, f"{GUIDE}.out_proj", h, guide)
    add_blocks(out, config, h, head, mlp, modulated=False)
    add_linear(out, "final_layer.linear", int(config.get("out_channels") or in_channels), h)
    return out


LAYOUT = OriginalLayout("img_in.weight", config_from_weights, variant_of, to_diffusers, skeleton)
