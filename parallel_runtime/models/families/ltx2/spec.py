"""LTX-2's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import ID, LTX2_19B


def _adapter():
    from .adapter import LTX2Adapter

    return LTX2Adapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoding():
    from .text import ENCODING

    return ENCODING


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _vae_file():
    from .vae_file import FORMAT

    return FORMAT


def _video_vae():
    from .vae_bands import VIDEO_VAE

    return VIDEO_VAE


# the audio stream and the audio<->video cross-attentions (their time embeddings and modulation tables included):
# never run (video-only), so never read from a file nor held (5.8B of the release's 18.9B parameters)
AUDIO_MODULES = ("audio_", "av_cross_attn_", "video_to_audio_", "video_a2v_")


# ComfyUI-GGUF's tools/convert.py detects LTX-2's Lightricks names as LTX-Video's ("ltxv") and keeps the same
# layers in the conversion type; the audio stream's are never read here
GGUF = GGUFFacts(
    architecture="ltxv",
    quantiser_keeps=("time_embed.", "caption_projection.", "proj_in.", "proj_out.", "scale_shift_table"),
)


def geometry(latent_channels: int | None) -> tuple[int, int]:
    """(pixels per token side, frames per latent frame): VAE 32x x patch 1, 8 frames per latent frame."""
    return 32, 8


FAMILY = FamilySpec(
    id=ID,
    label="LTX-2",
    transformer_class="LTX2VideoTransformer3DModel",
    pipeline_class="LTX2Pipeline",
    adapter=_adapter,
    markers=("av_ca_a2v_gate_adaln_single.", "av_cross_attn_video_a2v_gate."),
    detection_priority=2,  # before LTX-Video 0.9 (1): its files hold patchify_proj. too
    variants=(LTX2_19B,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=1024,
        comfy_nodes="Parallel Text Encode with gemma_3_12B_it*.safetensors, or on the diffusers folder (ComfyUI "
        "0.3.64 has no LTX-2 text encoder)",
        components=("connectors",),
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=3.0, text_tokens=0),  # cross-attention: the text is not in the sequence
    head_dim=128,
    geometry=geometry,
    generate_cfg=3.0,
    lora_markers=("av_ca_", "audio_attn1"),
    idle_modules=AUDIO_MODULES,
    default_size=(768, 512, 121),
    video_vae=_video_vae,
    vae_file=_vae_file,
    gguf=GGUF,
)
