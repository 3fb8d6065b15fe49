"""HunyuanVideo 1.5's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import ID, T2V


def _adapter():
    from .adapter import HunyuanVideo15Adapter

    return HunyuanVideo15Adapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _text_encoding():
    from .text import ENCODING

    return ENCODING


def _vae_file():
    from .vae_file import FORMAT

    return FORMAT


def _video_vae():
    from .vae_bands import VIDEO_VAE

    return VIDEO_VAE


def geometry(latent_channels: int | None) -> tuple[int, int]:
    """(pixels per token side, frames per latent frame): VAE 16x x patch 1, 4 frames per latent frame."""
    return 16, 4


# GGUF files of Comfy-Org's repackaged transformers: ComfyUI-GGUF's tools/convert.py tells them by the names it
# shares with HunyuanVideo 1.0 (double_blocks.0.img_attn_proj, the refiner's self_attn_qkv), so they carry its
# architecture "hyvid" (the tensor names tell the families apart); its quantiser keeps txt_in, img_in, time_in and
# final_layer (byt5_in, vision_in and the blocks are quantised) and leaves the 5-D patch embedding out (added back by
# fix_5d_tensors.py); Q4_K_M upgrades the fused img / txt q-k-v
GGUF = GGUFFacts(
    architecture="hyvid",
    required=MappingProxyType(
        {
            "img_in.proj.weight": "run ComfyUI-GGUF's tools/fix_5d_tensors.py on the file (its converter leaves the "
            "5-D patch embedding out; that tool adds it back), or use a published HunyuanVideo 1.5 GGUF"
        }
    ),
    quantiser_keeps=("x_embedder.", "context_embedder.", "time_embed.", "norm_out.", "proj_out."),
    q4_k_m=MappingProxyType({r"transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight": "Q5_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="HunyuanVideo 1.5",
    transformer_class="HunyuanVideo15Transformer3DModel",
    pipeline_class="HunyuanVideo15Pipeline",
    adapter=_adapter,
    markers=("byt5_in.", "context_embedder_2.", "cond_type_embed."),
    detection_priority=5,  # its files hold HunyuanVideo 1.0's token-refiner names (and Flux.1's markers)
    variants=(T2V,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(max_length=1000, comfy_nodes="Parallel Text Encode with the diffusers folder (Qwen2.5-VL + ByT5)"),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=6.0, text_tokens=64),
    head_dim=128,
    geometry=geometry,
    vae_file=_vae_file,
    video_vae=_video_vae,
    gguf=GGUF,
    # LoRA files route as every family's do: diffusers' / PEFT's names (``transformer.``, ``base_model.model.``) and
    # Tencent's (``diffusion_model.`` / kohya's ``lora_unet_`` + keys.py's original layout). Names only this family's
    # files hold, either layout (ByT5 mapper, condition-type embedding), for the "looks like" hint of a LoRA loaded
    # on another model:
    lora_markers=("byt5_in", "context_embedder_2", "cond_type_embed"),
    default_size=(848, 480, 121),  # the 480p release's usual size (121 frames)
)
