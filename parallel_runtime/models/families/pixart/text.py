"""PixArt prompts, as the PixArt pipelines encode them: the prompt lower-cased and stripped (encode_prompt's
clean_caption=False path); T5 with its attention mask (120 tokens for alpha, 300 for Sigma) -> tokens + mask."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, t5
from ..spec import TextEncoding
from . import ID

ALPHA_LENGTH, SIGMA_LENGTH = 120, 300
SIGMA_PIPELINE = "PixArtSigmaPipeline"


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    prompts = [p.lower().strip() for p in prompts]
    tokens, mask = t5(comps, "", prompts, t5_length, ID, masked=True)
    return Conditioning(tokens.to(device), None, mask.to(device))


def default_length(comps: TextComponents) -> int:
    """T5 tokens the pipeline uses by default: 300 for PixArtSigmaPipeline, else alpha's 120."""
    return SIGMA_LENGTH if comps.pipeline_class == SIGMA_PIPELINE else ALPHA_LENGTH


ENCODING = TextEncoding(encode, default_length=default_length)
