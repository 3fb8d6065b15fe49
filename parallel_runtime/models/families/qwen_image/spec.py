"""Qwen-Image's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from ..wan.latent import WAN21_PREVIEW  # Qwen-Image's VAE is Wan 2.1's
from . import ID, QWEN_IMAGE
from .comfy_inputs import COMFY_CONDITIONING


def _adapter():
    from .adapter import QwenImageAdapter

    return QwenImageAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoding():
    from .text import ENCODING

    return ENCODING


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


GGUF = GGUFFacts(  # ComfyUI-GGUF's files; Q4_K_M upgrades the value projection
    architecture="qwen_image",
    required=MappingProxyType({}),
    quantiser_keeps=("img_in.", "txt_in.", "time_text_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r".*\.attn\.to_v\.weight": "Q6_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="Qwen-Image",
    transformer_class="QwenImageTransformer2DModel",
    pipeline_class="QwenImagePipeline",
    adapter=_adapter,
    markers=("txt_norm.weight",),
    variants=(QWEN_IMAGE,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(max_length=512, comfy_nodes="CLIPLoader (qwen_2.5_vl_7b, type qwen_image) with CLIPTextEncode"),
    text_encoding=_text_encoding,
    layout=LayoutHints(default_cfg=2.5, text_tokens=64),
    head_dim=128,
    previews=(WAN21_PREVIEW,),
    lora_markers=("img_mlp",),
    text_encoder_file=_text_encoder_file,
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
)
