"""HunyuanVideo 1.0 transformers in their original layout (Tencent's names, which ComfyUI's files keep).

``double_blocks.N.img_attn_qkv``, ``single_blocks.N.linear1``, ``txt_in.individual_token_refiner.blocks.N``,
``final_layer.adaLN_modulation.1``... possibly inside a checkpoint under ``model.diffusion_model.``. The
conversion only renames and cuts rows (fused q/k/v and the single blocks' q/k/v/MLP input split in four, the
final modulation's shift/scale halves swapped), so a PipeFusion stage reads only its rows and LoRA files in this
layout are routed row by row. It is written from the two layouts' names (diffusers' own converter assumes the
3072-wide model). What the weights decide is read from the shapes: widths, depths, channels, the head width
from the q/k norms (ComfyUI assumes 128), guidance and the I2V input channels.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ...layout_shapes import Shapes, block_count, scaled_rope_axes, shape_of
from ..spec import OriginalLayout
from . import I2V_CONCAT, I2V_REPLACE, ID, T2V

ANCHOR = "txt_in.individual_token_refiner.blocks.0.norm1.weight"  # ComfyUI's model_detection marker too
LINEAR = ("weight", "bias")

# (original name, diffusers name) of the tensors that are only renamed, below the block prefixes
_TOP = {
    "img_in.proj": "x_embedder.proj",
    "time_in.mlp.0": "time_text_embed.timestep_embedder.linear_1",
    "time_in.mlp.2": "time_text_embed.timestep_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in.mlp.0": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.mlp.2": "time_text_embed.guidance_embedder.linear_2",
    "txt_in.input_embedder": "context_embedder.proj_in",
    "txt_in.t_embedder.mlp.0": "context_embedder.time_text_embed.timestep_embedder.linear_1",
    "txt_in.t_embedder.mlp.2": "context_embedder.time_text_embed.timestep_embedder.linear_2",
    "txt_in.c_embedder.linear_1": "context_embedder.time_text_embed.text_embedder.linear_1",
    "txt_in.c_embedder.linear_2": "context_embedder.time_text_embed.text_embedder.linear_2",
    "final_layer.linear": "proj_out",
}
REFINER_NAMES = {
    "norm1": "norm1",
    "self_attn_proj": "attn.to_out.0",
    "norm2": "norm2",
    "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2",
    "adaLN_modulation.1": "norm_out.linear",
}
DOUBLE_NAMES = {
    "img_mod.linear": "norm1.linear",
    "img_attn_proj": "attn.to_out.0",
    "img_mlp.fc1": "ff.net.0.proj",
    "img_mlp.fc2": "ff.net.2",
    "txt_mod.linear": "norm1_context.linear",
    "txt_attn_proj": "attn.to_add_out",
    "txt_mlp.fc1": "ff_context.net.0.proj",
    "txt_mlp.fc2": "ff_context.net.2",
}
DOUBLE_NORM_NAMES = {
    "img_attn_q_norm": "attn.norm_q",
    "img_attn_k_norm": "attn.norm_k",
    "txt_attn_q_norm": "attn.norm_added_q",
    "txt_attn_k_norm": "attn.norm_added_k",
}
_SINGLE = {"linear2": "proj_out", "modulation.linear": "norm.linear"}
_SINGLE_NORMS = {"q_norm": "attn.norm_q", "k_norm": "attn.norm_k"}

Pieces = tuple[tuple[str, int, int], ...]  # (diffusers name, first row, end row) of one original tensor


def conversion_table(config: Mapping[str, Any]) -> dict[str, Pieces]:
    """Original tensor name -> the diffusers tensors its rows become, in row order, for a transformer of
    ``config`` (a diffusers config). The final modulation's halves are swapped (see :func:`to_diffusers`)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    mlp = int(d * config["mlp_ratio"])
    table: dict[str, Pieces] = {}

    def whole(original: str, name: str, rows: int, suffixes=LINEAR) -> None:
        for s in suffixes:
            table[f"{original}.{s}"] = ((f"{name}.{s}", 0, rows),)

    def cut(original: str, names: tuple[str, ...], sizes: tuple[int, ...]) -> None:
        for s in LINEAR:
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            table[f"{original}.{s}"] = tuple((f"{n}.{s}", a, a + z) for n, a, z in zip(names, starts, sizes))

    tops = dict(_TOP)
    if not config.get("guidance_embeds"):
        tops = {k: v for k, v in tops.items() if not k.startswith("guidance_in")}
    for original, name in tops.items():
        whole(original, name, 0)
    for i in range(config.get("num_refiner_layers", 2)):
        o, n = f"txt_in.individual_token_refiner.blocks.{i}.", f"context_embedder.token_refiner.refiner_blocks.{i}."
        for part, name in REFINER_NAMES.items():
            whole(o + part, n + name, 0)
        cut(o + "self_attn_qkv", tuple(n + f"attn.to_{x}" for x in "qkv"), (d, d, d))
    for i in range(config["num_layers"]):
        o, n = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for part, name in DOUBLE_NAMES.items():
            whole(o + part, n + name, 0)
        for part, name in DOUBLE_NORM_NAMES.items():
            whole(o + part, n + name, 0, ("weight",))
        cut(o + "img_attn_qkv", tuple(n + f"attn.to_{x}" for x in "qkv"), (d, d, d))
        cut(o + "txt_attn_qkv", tuple(n + f"attn.add_{x}_proj" for x in "qkv"), (d, d, d))
    for i in range(config["num_single_layers"]):
        o, n = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        for part, name in _SINGLE.items():
            whole(o + part, n + name, 0)
        for part, name in _SINGLE_NORMS.items():
            whole(o + part, n + name, 0, ("weight",))
        names = (*(n + f"attn.to_{x}" for x in "qkv"), n + "proj_mlp")
        cut(o + "linear1", names, (d, d, d, mlp))
    for s in LINEAR:  # [shift, scale] in the file, [scale, shift] in diffusers' AdaLayerNormContinuous
        table[f"final_layer.adaLN_modulation.1.{s}"] = ((f"norm_out.linear.{s}", 0, 2 * d),)
    return table


def hunyuan_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    """The diffusers HunyuanVideoTransformer3DModel config entries these weights decide."""
    width, in_channels, pt, ph, _ = shape_of(shapes, "img_in.proj.weight", ID)
    head_dim = shape_of(shapes, "double_blocks.0.img_attn_q_norm.weight", ID)[0]
    if width % head_dim:
        raise ConfigError(
            f"HunyuanVideo weights {width} wide with {head_dim}-wide q/k norms",
            "the head width is the q/k norms' width and must divide the model width",
            "use the transformer file as published",
        )
    out = shape_of(shapes, "final_layer.linear.weight", ID)[0] // (pt * ph * ph)
    return {
        "in_channels": in_channels,
        "out_channels": out,
        "num_attention_heads": width // head_dim,
        "attention_head_dim": head_dim,
        "num_layers": block_count(shapes, "double_blocks."),
        "num_single_layers": block_count(shapes, "single_blocks."),
        "num_refiner_layers": block_count(shapes, "txt_in.individual_token_refiner.blocks."),
        "mlp_ratio": shape_of(shapes, "double_blocks.0.img_mlp.fc1.weight", ID)[0] / width,
        "rope_axes_dim": list(scaled_rope_axes(head_dim)),  # (16, 56, 56) for the released 128-wide heads
        "patch_size": ph,
        "patch_size_t": pt,
        "guidance_embeds": "guidance_in.mlp.0.weight" in shapes,
        "text_embed_dim": shape_of(shapes, "txt_in.input_embedder.weight", ID)[1],
        "pooled_projection_dim": shape_of(shapes, "vector_in.in_layer.weight", ID)[1],
        "image_condition_type": _image_condition(in_channels, out, base),
    }


def _image_condition(in_channels: int, out_channels: int, base: Mapping[str, Any]) -> str | None:
    if in_channels == 2 * out_channels + 1:
        return "latent_concat"
    return base.get("image_condition_type") if in_channels == out_channels else None


def hunyuan_variant(shapes: Shapes) -> str:
    """HunyuanVideo-I2V with 33 input channels (start image concatenated), else text-to-video. The 16-channel
    I2V model has the text-to-video structure (ComfyUI tells it apart by the graph's guidance_type only)."""
    in_channels = shape_of(shapes, "img_in.proj.weight", ID)[1]
    return I2V_CONCAT if in_channels == 33 else T2V


def apply_conversion(state: dict[str, torch.Tensor], table: Mapping[str, Pieces]) -> dict[str, torch.Tensor]:
    """Tencent's names -> diffusers names by ``table`` (renames and row cuts; converted tensors leave ``state``;
    the final modulation's (shift, scale) becomes diffusers' (scale, shift))."""
    out: dict[str, torch.Tensor] = {}
    for original, pieces in table.items():
        if original not in state:
            continue
        tensor = state.pop(original)
        if original.startswith("final_layer.adaLN_modulation.1."):
            shift, scale = tensor.chunk(2, dim=0)
            tensor = torch.cat([scale, shift], dim=0)
        for name, r0, r1 in pieces:
            out[name] = tensor if r1 == 0 else tensor[r0:r1]
    return out


def hunyuan_to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Original names -> diffusers names (renames and row cuts; converted tensors leave ``state``)."""
    return apply_conversion(state, conversion_table(config))


def hunyuan_skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The original layout's names and shapes for a diffusers config (LoRA files in Tencent's names)."""
    from diffusers import HunyuanVideoTransformer3DModel

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        model = HunyuanVideoTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return dict(original_shapes(conversion_table(config), shapes))


def original_shapes(table: Mapping[str, Pieces], shapes: Mapping[str, tuple[int, ...]]) -> Iterator:
    """(original name, shape) of every ``table`` entry whose diffusers pieces ``shapes`` holds."""
    for original, pieces in table.items():
        first = pieces[0][0]
        if first not in shapes:
            continue
        rows = sum((shapes[name][0] if r1 == 0 else r1 - r0) for name, r0, r1 in pieces)
        yield original, (rows, *shapes[first][1:])


LAYOUT = OriginalLayout(ANCHOR, hunyuan_config, hunyuan_variant, hunyuan_to_diffusers, hunyuan_skeleton)
VARIANTS = (T2V, I2V_CONCAT, I2V_REPLACE)
