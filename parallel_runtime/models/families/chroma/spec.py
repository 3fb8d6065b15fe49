"""Chroma's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..flux.latent import FLUX_PREVIEW
from ..flux.spec import GGUF as FLUX_GGUF
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import CHROMA1, ID


def _adapter():
    from .adapter import ChromaAdapter

    return ChromaAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _text_encoding():
    from .text import ENCODING

    return ENCODING


GGUF = GGUFFacts(  # ComfyUI-GGUF's converter takes Chroma's double / single blocks for Flux's: Flux's architecture
    architecture=FLUX_GGUF.architecture,
    required=MappingProxyType({}),
    quantiser_keeps=("x_embedder.", "context_embedder.", "norm_out.", "proj_out."),  # img_in, txt_in, final_layer
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="Chroma",
    transformer_class="ChromaTransformer2DModel",
    pipeline_class="ChromaPipeline",
    adapter=_adapter,
    markers=("distilled_guidance_layer.",),
    detection_priority=3,  # its files hold Flux's markers (double/single blocks, single_transformer_blocks)
    variants=(CHROMA1,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=512,
        comfy_nodes="CLIPLoader (t5xxl, type chroma) with CLIPTextEncode",
        lora_roles=MappingProxyType({"text_encoder": "t5xxl"}),
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=4.0, text_tokens=128),  # real CFG; the prompt's own tokens, unpadded
    head_dim=128,
    previews=(FLUX_PREVIEW,),  # ComfyUI's supported_models.Chroma: latent_formats.Flux
    generate_cfg=4.0,
    lora_markers=("distilled_guidance_layer",),
    gguf=GGUF,
)
