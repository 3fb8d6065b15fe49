"""HunyuanVideo 1.5 transformers in their original layouts (Tencent's ``hyvideo`` names, which ComfyUI's files keep).

Two layouts hold the same tensors: Tencent's release (``ckpts/transformer/<variant>/diffusion_pytorch_model
.safetensors``) keeps the double blocks' q, k and v apart (``double_blocks.N.img_attn_q``, ``txt_attn_k``...);
Comfy-Org's repackaged files (``hunyuanvideo1.5_720p_t2v_fp16.safetensors``, ``..._fp8_scaled``) fuse each
stream's three into ``img_attn_qkv`` / ``txt_attn_qkv``. Both fuse the token refiner's (``self_attn_qkv``), store
the final modulation as (shift, scale) and name the rest alike (``byt5_in.fc1``, ``vision_in.proj.1``,
``cond_type_embedding``...). The conversion only renames and cuts rows, so a PipeFusion stage reads only its
rows and LoRA files in Tencent's names are routed row by row.

What the weights decide is read from the shapes (widths, depth, channels, the head width from the q/k norms, the
text and image widths). Every published 480p / 720p text- and image-to-video transformer has the same structure
(the text-to-video ones keep the image projection ``vision_in``), so one shipped config fits them all; what sets
them apart (the pipeline's default size, flow shift) is not in the transformer's weights. Files holding parts
diffusers' HunyuanVideo15Transformer3DModel lacks (the step-distilled MeanFlow ``time_r_in``, a ``guidance_in``,
single-stream blocks) or another input width (the super-resolution models) are refused on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ...layout_shapes import Shapes, block_count, scaled_rope_axes, shape_of
from ..hunyuan_video.keys import (  # the same block names and conversion, by lineage
    DOUBLE_NAMES,
    DOUBLE_NORM_NAMES,
    REFINER_NAMES,
    apply_conversion,
    original_shapes,
)
from ..spec import OriginalLayout
from . import ID, T2V

ANCHOR = "byt5_in.fc1.weight"
LINEAR = ("weight", "bias")

_TOP = {  # original module -> diffusers module, renamed only
    "img_in.proj": "x_embedder.proj",
    "time_in.mlp.0": "time_embed.timestep_embedder.linear_1",
    "time_in.mlp.2": "time_embed.timestep_embedder.linear_2",
    "txt_in.input_embedder": "context_embedder.proj_in",
    "txt_in.t_embedder.mlp.0": "context_embedder.time_text_embed.timestep_embedder.linear_1",
    "txt_in.t_embedder.mlp.2": "context_embedder.time_text_embed.timestep_embedder.linear_2",
    "txt_in.c_embedder.linear_1": "context_embedder.time_text_embed.text_embedder.linear_1",
    "txt_in.c_embedder.linear_2": "context_embedder.time_text_embed.text_embedder.linear_2",
    "byt5_in.layernorm": "context_embedder_2.norm",
    "byt5_in.fc1": "context_embedder_2.linear_1",
    "byt5_in.fc2": "context_embedder_2.linear_2",
    "byt5_in.fc3": "context_embedder_2.linear_3",
    "vision_in.proj.0": "image_embedder.norm_in",
    "vision_in.proj.1": "image_embedder.linear_1",
    "vision_in.proj.3": "image_embedder.linear_2",
    "vision_in.proj.4": "image_embedder.norm_out",
    "final_layer.linear": "proj_out",
}
_STREAMS = {
    "img": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
# tensors of released files that diffusers' class has no place for -> why they cannot run here
_UNSUPPORTED = {
    "time_r_in.": "a step-distilled (MeanFlow) transformer: it takes a second timestep this engine does not give",
    "guidance_in.": "a guidance-embedding transformer: diffusers' HunyuanVideo15Transformer3DModel embeds no guidance",
    "single_blocks.": "single-stream blocks: HunyuanVideo 1.5's diffusers transformer has double-stream blocks only",
}

Pieces = tuple[tuple[str, int, int], ...]  # (diffusers name, first row, end row) of one original tensor; end 0: all


def conversion_table(config: Mapping[str, Any], fused: bool) -> dict[str, Pieces]:
    """Original tensor name -> the diffusers tensors its rows become, in row order, for a transformer of ``config``
    (a diffusers config): Comfy-Org's layout (``fused`` double-block q/k/v) or Tencent's (apart)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    table: dict[str, Pieces] = {}

    def whole(original: str, name: str, suffixes=LINEAR) -> None:
        for s in suffixes:
            table[f"{original}.{s}"] = ((f"{name}.{s}", 0, 0),)

    def cut(original: str, names: tuple[str, ...]) -> None:
        for s in LINEAR:
            table[f"{original}.{s}"] = tuple((f"{n}.{s}", i * d, (i + 1) * d) for i, n in enumerate(names))

    for original, name in _TOP.items():
        whole(original, name)
    table["cond_type_embedding.weight"] = (("cond_type_embed.weight", 0, 0),)
    whole("final_layer.adaLN_modulation.1", "norm_out.linear")
    for i in range(config.get("num_refiner_layers", 2)):
        o, n = f"txt_in.individual_token_refiner.blocks.{i}.", f"context_embedder.token_refiner.refiner_blocks.{i}."
        for part, name in REFINER_NAMES.items():
            whole(o + part, n + name)
        cut(o + "self_attn_qkv", tuple(n + f"attn.to_{x}" for x in "qkv"))
    for i in range(config["num_layers"]):
        o, n = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for part, name in DOUBLE_NAMES.items():
            whole(o + part, n + name)
        for part, name in DOUBLE_NORM_NAMES.items():
            whole(o + part, n + name, ("weight",))
        for stream, names in _STREAMS.items():
            if fused:
                cut(f"{o}{stream}_attn_qkv", tuple(n + x for x in names))
            else:
                for x, name in zip("qkv", names):
                    whole(f"{o}{stream}_attn_{x}", n + name)
    return table


def is_fused(names: Any) -> bool:
    """Whether the double blocks' q/k/v are fused (Comfy-Org's repackaged layout) in a file with these names."""
    return "double_blocks.0.img_attn_qkv.weight" in names


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    """The diffusers HunyuanVideo15Transformer3DModel config entries these weights decide."""
    _refuse_unsupported(shapes)
    width, in_channels, pt, ph, _ = shape_of(shapes, "img_in.proj.weight", ID)
    head_dim = shape_of(shapes, "double_blocks.0.img_attn_q_norm.weight", ID)[0]
    if width % head_dim:
        raise ConfigError(
            f"HunyuanVideo 1.5 weights {width} wide with {head_dim}-wide q/k norms",
            "the head width is the q/k norms' width and must divide the model width",
            "use the transformer file as published",
        )
    out = shape_of(shapes, "final_layer.linear.weight", ID)[0] // (pt * ph * ph)
    if in_channels != 2 * out + 1:
        raise ConfigError(
            f"a HunyuanVideo 1.5 transformer with {in_channels} input channels for {out} latent channels",
            "the text- and image-to-video transformers take the latent, a condition latent and a mask "
            f"({2 * out + 1} channels); other widths are the super-resolution models, which this engine does not run",
            "load a 480p / 720p t2v or i2v transformer (hunyuanvideo1.5_*_t2v / _i2v)",
        )
    return {
        "in_channels": in_channels,
        "out_channels": out,
        "num_attention_heads": width // head_dim,
        "attention_head_dim": head_dim,
        "num_layers": block_count(shapes, "double_blocks."),
        "num_refiner_layers": block_count(shapes, "txt_in.individual_token_refiner.blocks."),
        "mlp_ratio": shape_of(shapes, "double_blocks.0.img_mlp.fc1.weight", ID)[0] / width,
        "patch_size": ph,
        "patch_size_t": pt,
        "text_embed_dim": shape_of(shapes, "txt_in.input_embedder.weight", ID)[1],
        "text_embed_2_dim": shape_of(shapes, "byt5_in.fc1.weight", ID)[1],
        "image_embed_dim": shape_of(shapes, "vision_in.proj.1.weight", ID)[1],
        "rope_axes_dim": list(scaled_rope_axes(head_dim)),  # (16, 56, 56) for the released 128-wide heads
        "use_meanflow": False,
    }


def _refuse_unsupported(shapes: Shapes) -> None:
    for prefix, what in _UNSUPPORTED.items():
        found = next((k for k in shapes if k.startswith(prefix)), None)
        if found is not None:
            raise ConfigError(
                f"a HunyuanVideo 1.5 file holding {found}: {what}",
                "the engine runs diffusers' HunyuanVideo15Transformer3DModel, which has no such tensors",
                "load a 480p / 720p t2v or i2v transformer (e.g. hunyuanvideo1.5_720p_t2v_fp16.safetensors)",
            )


def variant_of(shapes: Shapes) -> str:
    """The one shipped config: the published t2v / i2v, 480p / 720p transformers differ in weights only."""
    return T2V


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Original names (either layout) -> diffusers names (renames and row cuts; converted tensors leave ``state``)."""
    return apply_conversion(state, conversion_table(config, is_fused(state)))


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tencent's names and shapes for a diffusers config (LoRA files in the release's names)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        model = HunyuanVideo15Transformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return dict(original_shapes(conversion_table(config, fused=False), shapes))


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers, skeleton)
