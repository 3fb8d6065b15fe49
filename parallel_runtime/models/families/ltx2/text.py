"""LTX-2 prompts: not encoded on the workers yet.

diffusers' LTX2Pipeline encodes a prompt with Gemma-3 (every hidden layer's states, normalised per prompt and
projected), then LTX-2's text connectors (``LTX2TextConnectors``: 1-D transformers with learned registers) give
the video and audio contexts. That encoder is not ported here yet: the transformer takes the connectors' video
context as ``Conditioning.prompt_embeds`` (with its attention mask), computed outside (e.g. by LTX2Pipeline's
``encode_prompt`` + ``connectors``), and a prompt given as text is refused with this message.
"""

from __future__ import annotations

import torch

from ....errors import ConfigError
from ...base import Conditioning
from ...text_parts import TextComponents
from ..spec import TextEncoding


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    raise ConfigError(
        "LTX-2 prompts given as text",
        "LTX-2's text encoder (Gemma-3 + its text connectors) does not run on the workers yet",
        "pass the connectors' video context as the conditioning's prompt embeddings (LTX2Pipeline.encode_prompt "
        "then its connectors), or sample LTX-2 with diffusers' LTX2Pipeline",
    )


ENCODING = TextEncoding(encode)
