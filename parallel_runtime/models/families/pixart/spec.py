"""PixArt-alpha / sigma's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, TextFacts
from . import ID, SIGMA_1024
from .latent import SD15_PREVIEW, SDXL_PREVIEW, preview_for


def _adapter():
    from .adapter import PixArtAdapter

    return PixArtAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _text_encoding():
    from .text import ENCODING

    return ENCODING


FAMILY = FamilySpec(
    id=ID,
    label="PixArt",
    transformer_class="PixArtTransformer2DModel",
    pipeline_class="PixArtSigmaPipeline",
    adapter=_adapter,
    markers=("adaln_single.", "t_block.", "y_embedder.", "caption_projection."),
    variants=(SIGMA_1024,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=120,
        comfy_nodes="CLIPLoader (t5xxl, type pixart) with CLIPTextEncode",
        lora_roles=MappingProxyType({"text_encoder": "t5xxl"}),
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=4.5, text_tokens=0),  # cross-attention: the text is not in the sequence
    head_dim=72,
    previews=(SD15_PREVIEW, SDXL_PREVIEW),  # alpha, Sigma
    generate_cfg=4.5,
    pick_preview=preview_for,
    lora_markers=("cross_attn",),
)
