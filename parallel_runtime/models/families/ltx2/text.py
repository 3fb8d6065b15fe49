"""LTX-2 prompts, as LTX2Pipeline encodes them: Gemma-3 on the prompt (stripped, padded on the LEFT to 1024 tokens,
run with its attention mask), the hidden states of the embeddings and of every layer stacked per token, then LTX-2's
text connectors (``LTX2TextConnectors``, the pipeline's ``connectors`` component: each layer's states normalised
over the prompt's tokens, projected, and a 1-D transformer whose learned registers take the padded positions). The
connectors' video context is the transformer's cross-attention text, with the connectors' mask; their audio
context is not used (video-only)."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, component
from ..spec import TextEncoding
from . import ID

PADDING_SIDE = "left"  # Gemma's, as LTX2Pipeline pads


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    gemma = component(comps, "encoder", "text_encoder", ID)
    connectors = component(comps, "encoder", "connectors", ID)
    tokenizer.padding_side = PADDING_SIDE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokens = tokenizer(
        [p.strip() for p in prompts],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    )
    where = next(gemma.parameters()).device
    ids, mask = tokens.input_ids.to(where), tokens.attention_mask.to(where)
    states = gemma(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    stacked = torch.stack(states, dim=-1).flatten(2, 3)  # [B, tokens, width x (layers + 1)]
    where = next(connectors.parameters()).device
    stacked = stacked.to(where, next(connectors.parameters()).dtype)
    video, _audio, video_mask = connectors(stacked, mask.to(where), padding_side=PADDING_SIDE)
    return Conditioning(video.to(device), None, video_mask.to(device))


ENCODING = TextEncoding(encode)
