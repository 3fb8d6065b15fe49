"""HunyuanVideo 1.0's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import I2V_CONCAT, I2V_REPLACE, ID, T2V
from .comfy_inputs import COMFY_CONDITIONING
from .latent import HUNYUAN_VIDEO_PREVIEW
from .lora_names import lora_aliases


def _adapter():
    from .adapter import HunyuanVideoAdapter

    return HunyuanVideoAdapter


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
    """(pixels per token side, frames per latent frame): VAE 8x x patch 2, 4 frames per latent frame."""
    return 16, 4


# ComfyUI-GGUF's files (architecture "hyvid", Tencent's names): its quantiser keeps txt_in, img_in, time_in,
# vector_in, guidance_in and final_layer; Q4_K_M upgrades the fused img / txt q-k-v (single blocks' linear1 is no
# q-k-v by name); the 5-D patch embedding img_in.proj.weight is left out by the converter and added back after
GGUF = GGUFFacts(
    architecture="hyvid",
    required=MappingProxyType(
        {
            "img_in.proj.weight": "run ComfyUI-GGUF's tools/fix_5d_tensors.py on the file (its converter leaves the "
            "5-D patch embedding out; that tool adds it back), or use a published HunyuanVideo GGUF"
        }
    ),
    quantiser_keeps=("x_embedder.", "context_embedder.", "time_text_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="HunyuanVideo",
    transformer_class="HunyuanVideoTransformer3DModel",
    pipeline_class="HunyuanVideoPipeline",
    adapter=_adapter,
    markers=("txt_in.individual_token_refiner.", "context_embedder.token_refiner."),
    detection_priority=4,  # its files hold Flux.1's markers (double/single blocks)
    variants=(T2V, I2V_CONCAT, I2V_REPLACE),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=256,
        comfy_nodes="DualCLIPLoader (clip_l + llava_llama3, type hunyuan_video) with CLIPTextEncode",
        lora_roles=MappingProxyType({"text_encoder": "llama", "text_encoder_2": "clip_l"}),
    ),
    text_encoding=_text_encoding,
    # guidance-distilled: one branch by default (CFG 1); the text (~20-80 prompt tokens) joins the sequence
    layout=LayoutHints(default_cfg=1.0, text_tokens=64),
    head_dim=128,
    previews=(HUNYUAN_VIDEO_PREVIEW,),
    geometry=geometry,
    distilled_guidance=True,
    lora_markers=("img_attn_qkv", "txt_attn_qkv", "individual_token_refiner", "token_refiner"),
    lora_aliases=lora_aliases,
    vae_file=_vae_file,
    text_encoder_file=_text_encoder_file,
    video_vae=_video_vae,
    default_size=(1280, 720, 129),  # HunyuanVideoPipeline's defaults (720p, 129 frames)
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
)
