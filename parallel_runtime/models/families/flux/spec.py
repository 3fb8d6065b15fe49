"""Flux.1's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import DEV, FILL, ID, SCHNELL
from .comfy_inputs import COMFY_CONDITIONING
from .latent import FLUX_PREVIEW


def _adapter():
    from .adapter import FluxAdapter

    return FluxAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoding():
    from .text import ENCODING

    return ENCODING


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


GGUF = GGUFFacts(  # ComfyUI-GGUF's files; Q4_K_M upgrades BFL's fused img / txt q-k-v
    architecture="flux",
    required=MappingProxyType({}),
    quantiser_keeps=("x_embedder.", "context_embedder.", "time_text_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="Flux",
    transformer_class="FluxTransformer2DModel",
    pipeline_class="FluxPipeline",
    adapter=_adapter,
    markers=("double_blocks.", "single_transformer_blocks.", "single_blocks."),
    detection_priority=2,  # SD3's markers: diffusers' Flux has context_embedder and transformer_blocks.N.ff_context
    variants=(DEV, SCHNELL, FILL),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=512,
        comfy_nodes="DualCLIPLoader (clip_l + t5xxl, type flux) with CLIPTextEncode",
        lora_roles=MappingProxyType({"text_encoder": "clip_l", "text_encoder_2": "t5xxl"}),
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=1.0, text_tokens=512),
    head_dim=128,
    previews=(FLUX_PREVIEW,),
    distilled_guidance=True,
    generate_cfg=1.0,
    lora_markers=("double_blocks", "single_blocks", "single_transformer_blocks"),
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
)
