"""LTX-Video 0.9 transformers in their original layout (Lightricks' names, which ComfyUI's files keep).

``ltx-video-2b-v0.9*.safetensors`` holds the transformer under ``model.diffusion_model.`` (the single-file loader
strips it) and the VAE under ``vae.`` in the same file (not read with the transformer). Lightricks' names differ
from diffusers' by four renames only (``patchify_proj`` -> ``proj_in``, ``adaln_single`` -> ``time_embed``,
``q_norm`` / ``k_norm`` -> ``norm_q`` / ``norm_k``), so a PipeFusion stage reads only its tensors and LoRA files in
this layout are routed tensor by tensor. What the weights decide is read from the shapes.

Lightricks' files also state their transformer settings as JSON in the safetensors metadata (``config``, its
``transformer`` part); ComfyUI 0.3.64's Load Checkpoint (CheckpointLoaderSimple) merges them into the model's
arguments, and from 0.9.5 on they set ``causal_temporal_positioning`` (the first latent frame's time: see
``adapter.rotary``). Those entries are read here as Load Checkpoint reads them (the heads too); a file without the
metadata (or a GGUF, which ComfyUI-GGUF loads without it) keeps the 0.9.0 positions. ComfyUI 0.3.64's
UNETLoader reads no metadata: on a 0.9.5+ file it samples with the 0.9.0 positions, unlike Load Checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ...layout_shapes import Shapes, block_count, shape_of
from ...name_table import renamed
from ..spec import OriginalLayout
from . import CAUSAL_POSITIONS, ID, LTXV_2B

log = logging.getLogger(__name__)

ANCHOR = "patchify_proj.weight"  # diffusers' single-file detection marker too
HEADS = 32  # every LTX-Video 0.9 model's; the weights cannot show it (q/k norms span all heads): ComfyUI assumes it
RENAMES = (("patchify_proj.", "proj_in."), ("adaln_single.", "time_embed."), (".q_norm.", ".norm_q."),
           (".k_norm.", ".norm_k."))  # fmt: skip


def to_diffusers_name(name: str) -> str:
    return renamed(name, RENAMES)


def to_original_name(name: str) -> str:
    return renamed(name, RENAMES, to_original=True)


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    width, in_channels = shape_of(shapes, "patchify_proj.weight", ID)
    head_dim = width // HEADS
    return {
        "in_channels": in_channels,
        "out_channels": shape_of(shapes, "proj_out.weight", ID)[0],
        "num_attention_heads": HEADS,
        "attention_head_dim": head_dim,
        "num_layers": block_count(shapes, "transformer_blocks."),
        "cross_attention_dim": shape_of(shapes, "transformer_blocks.0.attn2.to_k.weight", ID)[1],
        "caption_channels": shape_of(shapes, "caption_projection.linear_1.weight", ID)[1],
    }


def config_from_metadata(file_name: str, metadata: Mapping[str, str]) -> dict[str, Any]:
    """The entries of the file's ``config`` metadata that Load Checkpoint would use: the causal time positions
    and the heads (every release states 32)."""
    if "config" not in metadata:
        return {}
    fix = "save the file again without its config metadata, or use the file as Lightricks publish it"
    try:
        stated = json.loads(metadata["config"])
    except ValueError as exc:
        raise ConfigError(
            f"{file_name}: its config metadata is not JSON ({exc})",
            "LTX-Video files state their transformer settings there (ComfyUI's Load Checkpoint reads them)",
            fix,
        ) from None
    transformer = stated.get("transformer", {}) if isinstance(stated, dict) else {}
    causal = transformer.get("causal_temporal_positioning", False) if isinstance(transformer, dict) else False
    if not isinstance(causal, bool):
        raise ConfigError(
            f"{file_name}: causal_temporal_positioning {causal!r} in its config metadata",
            "it says whether the first latent frame's time position is causal: true or false",
            fix,
        )
    out: dict[str, Any] = {CAUSAL_POSITIONS: causal}
    for key in ("num_attention_heads", "attention_head_dim"):
        if isinstance(transformer.get(key), int):
            out[key] = transformer[key]
    if causal:
        log.info("%s: causal time positions (its config metadata, as ComfyUI's Load Checkpoint reads it)", file_name)
    return out


def variant_of(shapes: Shapes) -> str:
    return LTXV_2B


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {to_diffusers_name(name): state.pop(name) for name in list(state) if not name.startswith("vae.")}


def skeleton(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    from diffusers import LTXVideoTransformer3DModel

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        model = LTXVideoTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    return {to_original_name(k): tuple(v.shape) for k, v in model.state_dict().items()}


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, variant_of, to_diffusers, skeleton, config_from_metadata)
