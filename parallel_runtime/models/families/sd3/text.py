"""SD3 / SD3.5 prompts, as StableDiffusion3Pipeline encodes them: CLIP-L and CLIP-G penultimate hidden states
(77 tokens, concatenated, zero-padded to T5's width) followed by T5 (256 tokens) -> tokens; the CLIP-L + CLIP-G
projections -> pooled. Without T5, zeros of the transformer's joint width stand in (as diffusers does)."""

from __future__ import annotations

import torch
from torch import nn

from ...base import Conditioning
from ...text_parts import TextComponents, clip, clip_length, t5
from ..spec import TextEncoding
from . import ID


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    hidden, pooled = [], []
    clip_dtype = None
    for index in ("", "_2"):
        out, dtype = clip(comps, index, prompts, clip_length(comps), ID)
        clip_dtype = clip_dtype or dtype  # diffusers casts both CLIP outputs to text_encoder's dtype
        hidden.append(out.hidden_states[-2].to(device=device, dtype=clip_dtype))
        pooled.append(out[0].to(device))
    clip_tokens = torch.cat(hidden, dim=-1)
    if "text_encoder_3" in comps.text_encoders:
        t5_tokens = t5(comps, "_3", prompts, t5_length, ID, masked=False)[0].to(device)
    else:  # SD3 without T5: diffusers uses zeros of the transformer's joint width
        width = comps.transformer_config["joint_attention_dim"]
        t5_tokens = torch.zeros(len(prompts), t5_length, width, device=device, dtype=clip_dtype)
    clip_tokens = nn.functional.pad(clip_tokens, (0, t5_tokens.shape[-1] - clip_tokens.shape[-1]))
    return Conditioning(torch.cat([clip_tokens, t5_tokens], dim=-2), torch.cat(pooled, dim=-1))


ENCODING = TextEncoding(encode)
