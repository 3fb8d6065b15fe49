"""Wan transformers in their original layout (the Wan code's names, which ComfyUI keeps).

``blocks.N.self_attn.q``, ``cross_attn.k_img``, ``head.modulation``, ``img_emb.proj.1``... A file may sit
inside a full checkpoint under ``model.diffusion_model.``. What the weights decide is read from the shapes
the way ComfyUI's ``model_detection`` reads them (heads = width / 128, as ComfyUI assumes); the conversion
to diffusers names is diffusers' own ``convert_wan_transformer_to_diffusers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ... import compat
from ...layout_shapes import Shapes, block_count
from ..spec import OriginalLayout
from . import I2V_14B, I2V_A14B, T2V_1_3B, T2V_14B, TI2V_5B

HEAD_DIM = 128  # every Wan model; ComfyUI derives num_heads = dim // 128 the same way
ANCHOR = "head.modulation"
REF_CONV = "ref_conv.weight"  # Fun-Control's reference-image patch embedding (families/wan/reference.py)
REF_CONV_KEY = "_ref_conv_in_channels"  # the config entry saying the file has one (diffusers' class has none)
VACE_EMBED = "vace_patch_embedding.weight"  # Wan VACE: the control context's patch embedding
VACE_CLASS = "WanVACETransformer3DModel"


def wan_config(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    """The diffusers WanTransformer3DModel config entries these weights decide."""
    dim = shapes[ANCHOR][-1]
    patch = tuple(shapes["patch_embedding.weight"][2:])
    image = "img_emb.proj.1.weight" in shapes  # Wan 2.1 I2V / FLF2V: CLIP-vision image K/V
    return {
        "patch_size": list(patch),
        "num_attention_heads": dim // HEAD_DIM,
        "attention_head_dim": HEAD_DIM,
        "in_channels": shapes["patch_embedding.weight"][1],
        "out_channels": shapes["head.head.weight"][0] // (patch[0] * patch[1] * patch[2]),
        "text_dim": shapes["text_embedding.0.weight"][1],
        "freq_dim": shapes["time_embedding.0.weight"][1],
        "ffn_dim": shapes["blocks.0.ffn.0.weight"][0],
        "num_layers": block_count(shapes, "blocks."),
        "cross_attn_norm": "blocks.0.norm3.weight" in shapes,
        "qk_norm": "rms_norm_across_heads" if "blocks.0.self_attn.norm_q.weight" in shapes else None,
        "image_dim": shapes["img_emb.proj.1.weight"][1] if image else None,
        "added_kv_proj_dim": dim if "blocks.0.cross_attn.k_img.weight" in shapes else None,
        "pos_embed_seq_len": shapes["img_emb.emb_pos"][1] if "img_emb.emb_pos" in shapes else None,
        **vace_config(shapes),
        **({REF_CONV_KEY: shapes[REF_CONV][1]} if REF_CONV in shapes else {}),
    }


def vace_config(shapes: Shapes) -> dict[str, Any]:
    """A VACE file's class and VACE entries: its hint blocks sit after main blocks 0, k, 2k, ... with
    k = blocks // VACE blocks (the spacing ComfyUI's ``model_detection`` assumes from the counts); {} otherwise."""
    if VACE_EMBED not in shapes:
        return {}
    layers, hints = block_count(shapes, "blocks."), block_count(shapes, "vace_blocks.")
    after = list(range(0, layers, max(layers // max(hints, 1), 1)))
    if not hints or len(after) != hints:
        raise ConfigError(
            f"a Wan VACE file with {hints} VACE blocks for {layers} main blocks",
            "the VACE blocks are spread evenly over the main blocks (one after every blocks // vace_blocks "
            "main blocks), which these counts do not allow",
            "use a published Wan 2.1 VACE file (1.3B: 15 of 30 blocks, 14B: 8 of 40)",
        )
    return {"_class_name": VACE_CLASS, "vace_in_channels": shapes[VACE_EMBED][1], "vace_layers": after}


def wan_variant(shapes: Shapes) -> str:
    """Wan 2.2 TI2V-5B (48 output channels), Wan 2.1 I2V 14B (36 input channels + CLIP-vision image
    embedding), Wan 2.2 I2V A14B (36 without), else text-to-video: Wan 2.1 1.3B or 14B (the Wan 2.2 A14B
    experts have the 14B structure)."""
    if shapes["head.head.weight"][0] // 4 == 48:
        return TI2V_5B
    if shapes["patch_embedding.weight"][1] == 36:
        return I2V_14B if "img_emb.proj.1.weight" in shapes else I2V_A14B
    return T2V_1_3B if shapes[ANCHOR][-1] <= 2048 else T2V_14B


def wan_to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """diffusers' conversion; a Fun-Control file's ``ref_conv.*`` keep their names (the module the Wan adapter
    adds to the transformer, ``reference.extra_modules``)."""
    return compat.convert_wan_transformer(state)


LAYOUT = OriginalLayout(ANCHOR, wan_config, wan_variant, wan_to_diffusers)
