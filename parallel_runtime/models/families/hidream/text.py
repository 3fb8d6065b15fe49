"""HiDream prompts from a diffusers folder's own encoders: not encoded on the workers. HiDream's four text
encoders (CLIP-L, CLIP-G, T5-XXL and Llama-3.1-8B-Instruct's hidden states of every layer, ~25 GB together) are
read from ComfyUI's files instead (``text_file``: Parallel Text Encode's text_encoder .. text_encoder_4), or
ComfyUI's QuadrupleCLIPLoader with CLIPTextEncode encodes them. A folder's encoders are refused with those ways
out (on the host, before any job: ``on_workers=False``; they are not loaded)."""

from __future__ import annotations

import torch

from ....errors import ConfigError
from ...base import Conditioning
from ...text_parts import TextComponents
from ..spec import TextEncoding


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    raise ConfigError(
        "HiDream prompts cannot be encoded by the parallel text encoder",
        "HiDream's four text encoders (CLIP-L, CLIP-G, T5-XXL and Llama-3.1 8B, every layer's states) are not "
        "run on the workers",
        "choose HiDream's four text-encoder files in Parallel Text Encode (llama_3.1_8b_instruct*, t5xxl*, "
        "clip_l_hidream, clip_g_hidream), or encode in ComfyUI (QuadrupleCLIPLoader; CLIPTextEncode)",
    )


ENCODING = TextEncoding(encode, on_workers=False)
