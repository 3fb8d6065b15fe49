"""LTX-Video prompts, as LTXPipeline encodes them: T5 (128 tokens) run WITHOUT its attention mask; the mask goes
to the transformer, whose cross-attention ignores the padded tokens."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, t5
from ..spec import TextEncoding
from . import ID


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    tokens, mask = t5(comps, "", prompts, t5_length, ID, masked=False)
    return Conditioning(tokens.to(device), None, mask.to(device))


ENCODING = TextEncoding(encode)
