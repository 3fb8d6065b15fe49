"""FLUX.2's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..flux.spec import GGUF as FLUX1_GGUF
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import DEV, ID
from .comfy_inputs import COMFY_CONDITIONING


def _adapter():
    from .adapter import Flux2Adapter

    return Flux2Adapter


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
    architecture=FLUX1_GGUF.architecture,  # ComfyUI-GGUF's converter files FLUX.2 under Flux.1's architecture
    required=MappingProxyType({}),
    quantiser_keeps=("x_embedder.", "context_embedder.", "time_guidance_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="FLUX.2",
    transformer_class="Flux2Transformer2DModel",
    pipeline_class="Flux2Pipeline",
    adapter=_adapter,
    markers=("double_stream_modulation_img.",),
    detection_priority=3,  # its files hold Flux.1's markers (double/single blocks) and SD3's (context_embedder)
    variants=(DEV,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=512, comfy_nodes="CLIPLoader (the FLUX.2 Mistral text encoder, type flux2) with CLIPTextEncode"
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=1.0, text_tokens=512),
    head_dim=128,
    previews=(),  # ComfyUI 0.3.64 knows no FLUX.2 latent format (see latent.py)
    distilled_guidance=True,
    gguf=GGUF,
    comfy_conditioning=COMFY_CONDITIONING,
)
