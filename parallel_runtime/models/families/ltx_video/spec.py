"""LTX-Video 0.9's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import ID, LTXV_2B
from .comfy_inputs import COMFY_CONDITIONING
from .latent import LTXV_PREVIEW


def _adapter():
    from .adapter import LTXVideoAdapter

    return LTXVideoAdapter


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


def geometry(latent_channels: int | None) -> tuple[int, int]:
    """(pixels per token side, frames per latent frame): VAE 32x x patch 1, 8 frames per latent frame."""
    return 32, 8


# ComfyUI-GGUF's files (architecture "ltxv", Lightricks' names): its quantiser keeps the time, caption, input and
# output layers and every scale_shift_table (F32); Q4_K_M upgrades the value and feed-forward output projections
GGUF = GGUFFacts(
    architecture="ltxv",
    quantiser_keeps=("time_embed.", "caption_projection.", "proj_in.", "proj_out.", "scale_shift_table"),
    q4_k_m=MappingProxyType({r".*\.attn[12]\.to_v\.weight": "Q6_K", r".*\.ff\.net\.2\.weight": "Q6_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="LTX-Video",
    transformer_class="LTXVideoTransformer3DModel",
    pipeline_class="LTXPipeline",
    adapter=_adapter,
    markers=("patchify_proj.",),
    detection_priority=1,  # before PixArt: its files hold adaln_single. and caption_projection. too
    variants=(LTXV_2B,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(max_length=128, comfy_nodes="CLIPLoader (t5xxl, type ltxv) with CLIPTextEncode + LTXVConditioning"),
    text_encoding=_text_encoding,
    layout=LayoutHints(default_cfg=3.0, text_tokens=0),  # cross-attention: the text is not in the sequence
    head_dim=64,
    previews=(LTXV_PREVIEW,),
    geometry=geometry,
    generate_cfg=3.0,
    lora_markers=("patchify_proj", "adaln_single"),
    default_size=(768, 512, 97),
    vae_file=_vae_file,
    text_encoder_file=_text_encoder_file,
    video_vae=_video_vae,
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
)
