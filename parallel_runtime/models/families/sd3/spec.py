"""SD3 / SD3.5's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import ID, SD3_MEDIUM, SD35_LARGE, SD35_MEDIUM
from .latent import SD3_PREVIEW


def _adapter():
    from .adapter import SD3Adapter

    return SD3Adapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _text_encoding():
    from .text import ENCODING

    return ENCODING


GGUF = GGUFFacts(  # ComfyUI-GGUF's files; Q4_K_M upgrades Stability's fused q-k-v
    architecture="sd3",
    required=MappingProxyType({}),
    quantiser_keeps=("pos_embed.", "context_embedder.", "time_text_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="SD3",
    transformer_class="SD3Transformer2DModel",
    pipeline_class="StableDiffusion3Pipeline",
    adapter=_adapter,
    markers=("joint_blocks.", "context_embedder.weight", "transformer_blocks.0.ff_context"),
    detection_priority=1,  # PixArt's markers: Stability's layout has y_embedder too
    variants=(SD3_MEDIUM, SD35_MEDIUM, SD35_LARGE),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=256,
        comfy_nodes="TripleCLIPLoader (clip_l + clip_g + t5xxl) with CLIPTextEncode",
        lora_roles=MappingProxyType({"text_encoder": "clip_l", "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl"}),
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=4.5, text_tokens=333),
    head_dim=64,
    previews=(SD3_PREVIEW,),
    generate_cfg=5.0,
    lora_markers=("joint_blocks", "context_block"),
    gguf=GGUF,
)
