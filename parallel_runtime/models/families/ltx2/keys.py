"""LTX-2 transformers in their original layout (Lightricks' names: ``ltx-2-19b-dev.safetensors`` and friends).

The release file holds the transformer under ``model.diffusion_model.`` (the single-file loader strips it), its
text connectors there too (``video_embeddings_connector`` / ``audio_embeddings_connector``: the text side, not read
with the transformer), and the video VAE, audio VAE and vocoder under ``vae.`` / ``audio_vae.`` / ``vocoder.``.
Lightricks' transformer names differ from diffusers' by renames only (diffusers'
``convert_ltx2_transformer_to_diffusers``, which the tests compare with), so a PipeFusion stage reads only its
tensors and LoRA files in this layout are routed tensor by tensor. What the weights decide is read from the shapes;
the head count is not in them (the q/k norms span all heads): 32, every LTX-2.0 release's (video and audio), unless
the file's ``config`` metadata (Lightricks' JSON, its ``transformer`` part) states the heads; its rotary type and
frequency precision are read there too when stated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ...layout_shapes import Shapes, block_count, shape_of
from ...name_table import renamed
from ..spec import OriginalLayout
from . import ID, LTX2_19B

ANCHOR = "av_ca_a2v_gate_adaln_single.emb.timestep_embedder.linear_1.weight"  # diffusers' detection marker too
HEADS = AUDIO_HEADS = 32
NOT_TRANSFORMER = ("vae.", "audio_vae.", "vocoder.", "text_embedding_projection.")
TEXT_SIDE = ("video_embeddings_connector.", "audio_embeddings_connector.")
RENAMES = (  # (original, diffusers); a leading "." renames inside a name, else a prefix
    ("audio_patchify_proj.", "audio_proj_in."),
    ("patchify_proj.", "proj_in."),
    ("audio_adaln_single.", "audio_time_embed."),
    ("adaln_single.", "time_embed."),
    ("av_ca_video_scale_shift_adaln_single.", "av_cross_attn_video_scale_shift."),
    ("av_ca_a2v_gate_adaln_single.", "av_cross_attn_video_a2v_gate."),
    ("av_ca_audio_scale_shift_adaln_single.", "av_cross_attn_audio_scale_shift."),
    ("av_ca_v2a_gate_adaln_single.", "av_cross_attn_audio_v2a_gate."),
    (".scale_shift_table_a2v_ca_video", ".video_a2v_cross_attn_scale_shift_table"),
    (".scale_shift_table_a2v_ca_audio", ".audio_a2v_cross_attn_scale_shift_table"),
    (".q_norm.", ".norm_q."),
    (".k_norm.", ".norm_k."),
)


def to_diffusers_name(name: str) -> str:
    return renamed(name, RENAMES)


def to_original_name(name: str) -> str:
    return renamed(name, RENAMES, to_original=True)


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    width, in_channels = shape_of(shapes, "patchify_proj.weight", ID)
    audio_width, audio_in = shape_of(shapes, "audio_patchify_proj.weight", ID)
    heads = base.get("num_attention_heads", HEADS)  # the shipped config's, or the caller's override
    audio_heads = base.get("audio_num_attention_heads", AUDIO_HEADS)
    return {
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "proj_out.weight", ID)[0],
        "num_attention_heads": heads,
        "attention_head_dim": width // heads,
        "cross_attention_dim": width,
        "audio_in_channels": audio_in,
        "audio_out_channels": shape_of(shapes, "audio_proj_out.weight", ID)[0],
        "audio_num_attention_heads": audio_heads,
        "audio_attention_head_dim": audio_width // audio_heads,
        "audio_cross_attention_dim": audio_width,
        "num_layers": block_count(shapes, "transformer_blocks."),
        "caption_channels": shape_of(shapes, "caption_projection.linear_1.weight", ID)[1],
    }


METADATA_INTS = ("num_attention_heads", "attention_head_dim", "audio_num_attention_heads", "audio_attention_head_dim")


def config_from_metadata(file_name: str, metadata: Mapping[str, str]) -> dict[str, Any]:
    """The heads, rotary type ("interleaved" / "split") and frequency precision the file's ``config`` metadata
    states for its transformer (nothing when it has none)."""
    if "config" not in metadata:
        return {}
    try:
        stated = json.loads(metadata["config"])
    except ValueError as exc:
        raise ConfigError(
            f"{file_name}: its config metadata is not JSON ({exc})",
            "LTX-2 files state their transformer settings there",
            "save the file again without its config metadata, or use the file as Lightricks publish it",
        ) from None
    transformer = stated.get("transformer", {}) if isinstance(stated, dict) else {}
    transformer = transformer if isinstance(transformer, dict) else {}
    out: dict[str, Any] = {k: transformer[k] for k in METADATA_INTS if isinstance(transformer.get(k), int)}
    if transformer.get("rope_type") in ("interleaved", "split"):
        out["rope_type"] = transformer["rope_type"]
    if transformer.get("frequencies_precision") in ("float32", "float64"):
        out["rope_double_precision"] = transformer["frequencies_precision"] == "float64"
    return out


def variant_of(shapes: Shapes) -> str:
    return LTX2_19B


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {
        to_diffusers_name(name): state.pop(name)
        for name in list(state)
        if not name.startswith(NOT_TRANSFORMER) and not name.startswith(TEXT_SIDE)
    }


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    from diffusers import LTX2VideoTransformer3DModel

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        model = LTX2VideoTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    return {to_original_name(k): tuple(v.shape) for k, v in model.state_dict().items()}


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers, skeleton, config_from_metadata)
