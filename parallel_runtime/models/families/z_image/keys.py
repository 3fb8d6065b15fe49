"""Z-Image files in their original layout, the one Tongyi-MAI's code and Comfy-Org's repackaged files
(``z_image_turbo_bf16.safetensors``) use: fused ``attention.qkv``, ``attention.out``, ``q_norm`` / ``k_norm``,
``x_embedder`` and ``final_layer`` without the patch-size key. What the weights decide of the diffusers config,
the conversion to diffusers names (diffusers' own converter: renames and a three-way row split) and the layout
computed back from a diffusers config (names and shapes, for LoRA files written against it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import compat
from ...layout_shapes import TIMESTEP_FEATURES, Shapes, StateDict, add_linear, block_count, heads_of, shape_of
from ..spec import OriginalLayout
from . import ID, Z_IMAGE_6B

ANCHOR = "x_embedder.weight"  # diffusers' layout calls it all_x_embedder.2-1.weight
PATCH_VALUES = 2 * 2 * 1  # 2x2 patches, one frame
ADALN_WIDTH = 256  # the timestep embedding's width (diffusers' ADALN_EMBED_DIM), for dim >= 256
TIME_HIDDEN = 1024  # the timestep MLP's hidden width


def rope_axes(head_dim: int) -> list[int]:
    """Z-Image's rotary split of a head over (caption index, row, column): (32, 48, 48) for 128, scaled the same
    way for other widths (each part even)."""
    first = head_dim // 4 // 2 * 2
    side = (head_dim - first) // 2 // 2 * 2
    return [head_dim - 2 * side, side, side]


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    dim, values = shape_of(shapes, ANCHOR, ID)
    qk_norm = "layers.0.attention.q_norm.weight" in shapes
    if qk_norm:
        head_dim = shape_of(shapes, "layers.0.attention.q_norm.weight", ID)[0]
    else:  # no per-head tensor shows the head width: the shipped config's
        head_dim = int(base["dim"]) // int(base["n_heads"])
    heads = heads_of(dim, head_dim, ID)
    same_heads = head_dim == int(base["dim"]) // int(base["n_heads"])
    return {
        "dim": dim,
        "in_channels": values // PATCH_VALUES,
        "n_layers": block_count(shapes, "layers."),
        "n_refiner_layers": block_count(shapes, "noise_refiner."),
        "n_heads": heads,
        "n_kv_heads": heads,
        "qk_norm": qk_norm,
        "cap_feat_dim": shape_of(shapes, "cap_embedder.1.weight", ID)[1],
        "axes_dims": list(base["axes_dims"]) if same_heads else rope_axes(head_dim),
    }


def variant_of(shapes: Shapes) -> str:
    """Turbo and base have the same tensors: one shipped config serves both."""
    return Z_IMAGE_6B


def to_diffusers(state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """diffusers' converter (it takes every tensor out of ``state``)."""
    return compat.convert_z_image_transformer(state)


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The original layout of a diffusers config (names and shapes)."""
    dim, heads = int(config["dim"]), int(config["n_heads"])
    head, hidden, adaln = dim // heads, int(dim / 3 * 8), min(dim, ADALN_WIDTH)
    values, cap = PATCH_VALUES * int(config["in_channels"]), int(config["cap_feat_dim"])
    out: dict[str, tuple[int, ...]] = {}
    add_linear(out, "x_embedder", dim, values)
    add_linear(out, "t_embedder.mlp.0", TIME_HIDDEN, TIMESTEP_FEATURES)
    add_linear(out, "t_embedder.mlp.2", adaln, TIME_HIDDEN)
    out["cap_embedder.0.weight"] = (cap,)
    add_linear(out, "cap_embedder.1", dim, cap)
    out["x_pad_token"] = out["cap_pad_token"] = (1, dim)
    refiners = int(config["n_refiner_layers"])
    lists = (("noise_refiner", refiners, True), ("context_refiner", refiners, False))
    for name, count, modulated in (*lists, ("layers", int(config["n_layers"]), True)):
        for i in range(count):
            block = f"{name}.{i}"
            add_linear(out, f"{block}.attention.qkv", 3 * dim, dim, bias=False)
            add_linear(out, f"{block}.attention.out", dim, dim, bias=False)
            if config.get("qk_norm", True):
                out[f"{block}.attention.q_norm.weight"] = out[f"{block}.attention.k_norm.weight"] = (head,)
            add_linear(out, f"{block}.feed_forward.w1", hidden, dim, bias=False)
            add_linear(out, f"{block}.feed_forward.w2", dim, hidden, bias=False)
            add_linear(out, f"{block}.feed_forward.w3", hidden, dim, bias=False)
            for norm in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
                out[f"{block}.{norm}.weight"] = (dim,)
            if modulated:
                add_linear(out, f"{block}.adaLN_modulation.0", 4 * dim, adaln)
    add_linear(out, "final_layer.linear", values, dim)
    add_linear(out, "final_layer.adaLN_modulation.1", dim, adaln)
    return out


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers, skeleton)
