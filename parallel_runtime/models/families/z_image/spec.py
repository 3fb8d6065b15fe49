"""Z-Image's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..flux.latent import FLUX_PREVIEW  # Z-Image's VAE is Flux.1's
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import ID, Z_IMAGE_6B


def _adapter():
    from .adapter import ZImageAdapter

    return ZImageAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoding():
    from .text import ENCODING

    return ENCODING


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


GGUF = GGUFFacts(  # ComfyUI-GGUF's files (its converter's "lumina2": Z-Image's layout is Lumina 2's NextDiT)
    architecture="lumina2",
    required=MappingProxyType({}),
    # the quantiser keeps the embedders, the final layer and both refiners (2-D weights of the main layers only)
    quantiser_keeps=(
        "all_x_embedder.",
        "t_embedder.",
        "cap_embedder.",
        "noise_refiner.",
        "context_refiner.",
        "all_final_layer.",
        "x_pad_token",
        "cap_pad_token",  # not weights: llama.cpp quantises only "*weight" tensors
    ),  # fmt: skip
    # Q4_K_M: the fused attention.qkv -> Q5_K, feed_forward.w2 -> Q6_K
    q4_k_m=MappingProxyType(
        {r"layers\.\d+\.attention\.to_[qkv]\.weight": "Q5_K", r"layers\.\d+\.feed_forward\.w2\.weight": "Q6_K"}
    ),
)


FAMILY = FamilySpec(
    id=ID,
    label="Z-Image",
    transformer_class="ZImageTransformer2DModel",
    pipeline_class="ZImagePipeline",
    adapter=_adapter,
    markers=("x_pad_token", "cap_pad_token"),
    variants=(Z_IMAGE_6B,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=512,
        comfy_nodes="CLIPLoader (qwen_3_4b, type lumina2: a ComfyUI newer than 0.3.64) with CLIPTextEncode",
    ),
    text_encoding=_text_encoding,
    layout=LayoutHints(default_cfg=1.0, text_tokens=256),  # Turbo runs without CFG; the caption pads to 32s
    head_dim=128,
    previews=(FLUX_PREVIEW,),
    generate_cfg=1.0,
    lora_markers=("noise_refiner", "context_refiner", "feed_forward.w"),
    lora_prefixes=("diffusion_model.",),  # AI-Toolkit & co. write diffusers names (to_q...) under ComfyUI's prefix
    text_encoder_file=_text_encoder_file,
    gguf=GGUF,
)
