"""Wan prompts, as the Wan pipelines encode them: the prompt cleaned (ftfy when installed, HTML entities,
whitespace); UMT5 with its attention mask (512 tokens), the states past the prompt's tokens zeroed -> tokens."""

from __future__ import annotations

import html
import re

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, t5
from ..spec import TextEncoding
from . import ID


def clean_wan_prompt(text: str) -> str:
    """The Wan pipelines' prompt_clean: ftfy's fix_text (when installed), HTML entities unescaped twice,
    runs of whitespace as one space, stripped."""
    try:
        import ftfy
    except ImportError:  # diffusers skips it too when it is missing
        ftfy = None
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def encode(comps: TextComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    prompts = [clean_wan_prompt(p) for p in prompts]
    tokens, mask = t5(comps, "", prompts, t5_length, ID, masked=True)
    keep = mask.to(tokens.device).gt(0).unsqueeze(-1)  # the states past each prompt's tokens are zeros
    return Conditioning(torch.where(keep, tokens, torch.zeros_like(tokens)).to(device))


ENCODING = TextEncoding(encode)
