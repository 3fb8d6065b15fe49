"""Wan 2.1 / 2.2's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import I2V_14B, I2V_A14B, ID, T2V_1_3B, T2V_14B, TI2V_5B
from .comfy_inputs import COMFY_CONDITIONING
from .latent import WAN21_PREVIEW, WAN22, WAN22_PREVIEW


def _adapter():
    from .adapter import WanAdapter

    return WanAdapter


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


def geometry(latent_channels: int | None) -> tuple[int, int]:
    """(pixels per token side, frames per latent frame): 16 (VAE 8 x patch 2), or 32 for the 48-channel TI2V-5B
    whose VAE compresses 16x; 4 frames per latent frame."""
    return (32 if latent_channels == WAN22.channels else 16), 4


GGUF = GGUFFacts(  # ComfyUI-GGUF's files; Q4_K_M upgrades the value and feed-forward output projections
    architecture="wan",
    required=MappingProxyType(
        {
            "patch_embedding.weight": "run ComfyUI-GGUF's tools/fix_5d_tensors.py on the file (its converter leaves the 5-D patch embedding out; that tool adds it back), or use a published Wan GGUF"
        }
    ),
    quantiser_keeps=("patch_embedding.", "condition_embedder.", "proj_out.", "scale_shift_table"),
    q4_k_m=MappingProxyType({r".*\.attn[12]\.to_v\.weight": "Q6_K", r".*\.ffn\.net\.2\.weight": "Q6_K"}),
)


def _extra_modules(config):
    """A Fun-Control file's reference-image patch embedding (``reference.extra_modules``)."""
    from .reference import extra_modules

    return extra_modules(config)


def _expert_boundary(config) -> float:
    """diffusers' Wan 2.2 A14B pipelines' boundary_ratio: 0.9 image-to-video (36 input channels), else 0.875."""
    return 0.9 if config.get("in_channels") == 36 else 0.875


FAMILY = FamilySpec(
    id=ID,
    label="Wan",
    transformer_class="WanTransformer3DModel",
    more_transformer_classes=("WanVACETransformer3DModel",),  # a VACE file (keys.vace_config)
    pipeline_class="WanPipeline",
    adapter=_adapter,
    markers=("head.modulation", "condition_embedder.time_proj."),
    variants=(T2V_1_3B, T2V_14B, I2V_14B, I2V_A14B, TI2V_5B),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(max_length=512, comfy_nodes="CLIPLoader (umt5_xxl, type wan) with CLIPTextEncode"),
    text_encoding=_text_encoding,
    layout=LayoutHints(default_cfg=5.0, text_tokens=0),  # cross-attention: the text is not in the sequence
    head_dim=128,
    previews=(WAN21_PREVIEW, WAN22_PREVIEW),
    geometry=geometry,
    default_size=(832, 480, 81),  # WanPipeline's defaults (480p, 81 frames)
    lora_markers=("self_attn.q", "cross_attn"),
    vae_file=_vae_file,
    text_encoder_file=_text_encoder_file,
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
    expert_boundary=_expert_boundary,
    extra_modules=_extra_modules,
)
