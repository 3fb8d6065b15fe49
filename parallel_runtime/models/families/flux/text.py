"""Flux.1 prompts, as FluxPipeline encodes them: CLIP-L's pooled output (77 tokens) -> pooled; T5's last hidden
state (512 tokens) -> tokens."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, clip, clip_length, t5
from ..spec import TextEncoding
from . import ID


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    clip_out, clip_dtype = clip(comps, "", prompts, clip_length(comps), ID)
    tokens, _ = t5(comps, "_2", prompts, t5_length, ID, masked=False)
    return Conditioning(tokens.to(device), clip_out.pooler_output.to(device=device, dtype=clip_dtype))


ENCODING = TextEncoding(encode)
