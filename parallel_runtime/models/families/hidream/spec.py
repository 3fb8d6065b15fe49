"""HiDream-I1's declaration: see ``families.spec.FamilySpec`` for what each field means."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from ....parallel.layout import LayoutHints
from ..flux.latent import FLUX_PREVIEW  # ComfyUI's supported_models.HiDream: latent_formats.Flux
from ..spec import FamilySpec, GGUFFacts, TextFacts
from . import HIDREAM_I1, ID
from .comfy_inputs import COMFY_CONDITIONING


def _adapter():
    from .adapter import HiDreamAdapter

    return HiDreamAdapter


def _original_layout():
    from .keys import LAYOUT

    return LAYOUT


def _text_encoder_file():
    from .text_file import ENCODER_FILE

    return ENCODER_FILE


def _text_encoding():
    from .text import ENCODING

    return ENCODING


GGUF = GGUFFacts(  # ComfyUI-GGUF's "hidream" files: the release's (= diffusers') names; the MoE gates stay F32
    architecture="hidream",
    quantiser_keeps=("p_embedder.", "t_embedder.", "x_embedder.", "final_layer.", "caption_projection."),
    q4_k_m=MappingProxyType({r".*\.to_v\.weight": "Q6_K", r".*experts\..*\.w2\.weight": "Q6_K"}),
)


FAMILY = FamilySpec(
    id=ID,
    label="HiDream-I1",
    transformer_class="HiDreamImageTransformer2DModel",
    pipeline_class="HiDreamImagePipeline",
    adapter=_adapter,
    markers=("double_stream_blocks.0.block.", "caption_projection.0.linear"),
    detection_priority=1,  # before PixArt: its marker x_embedder.proj is in these files too
    variants=(HIDREAM_I1,),
    folder=Path(__file__).resolve().parent,
    original_layout=_original_layout,
    text=TextFacts(
        max_length=128,
        comfy_nodes="QuadrupleCLIPLoader (clip_l + clip_g + t5xxl + llama_3.1_8b) with CLIPTextEncode",
    ),
    text_encoding=_text_encoding,
    text_encoder_file=_text_encoder_file,
    layout=LayoutHints(default_cfg=5.0, text_tokens=384),  # Full's CFG; T5 128 + Llama 128 + a block's 128
    head_dim=128,
    previews=(FLUX_PREVIEW,),
    generate_cfg=5.0,
    lora_markers=("double_stream_blocks", "single_stream_blocks"),
    comfy_conditioning=COMFY_CONDITIONING,
    gguf=GGUF,
)
