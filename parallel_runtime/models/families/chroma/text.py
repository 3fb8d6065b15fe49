"""Chroma prompts, as ChromaPipeline encodes them: T5 with its attention mask over 512 padded tokens; the
transformer sees the prompt's tokens, its end token and ONE padding token (the pipeline masks the rest).
The tokens after those are cut here: a batch keeps as many as its longest prompt needs, with a mask when
its prompts differ (ComfyUI's Chroma text encoder gives the unpadded tokens with no mask)."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, t5
from ..spec import TextEncoding
from . import ID


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    states, mask = t5(comps, "", prompts, t5_length, ID, masked=True)
    seen = (mask.sum(dim=1) + 1).clamp(max=mask.shape[1])  # the pipeline keeps token indices <= the prompt's length
    keep = torch.arange(mask.shape[1])[None, :] < seen[:, None]
    length = int(seen.max())
    states, keep = states[:, :length], keep[:, :length]
    return Conditioning(states.to(device), None, None if bool(keep.all()) else keep.long().to(device))


ENCODING = TextEncoding(encode)
