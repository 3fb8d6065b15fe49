"""Qwen-Image prompts, as QwenImagePipeline encodes them with Qwen2.5-VL: the prompt in Qwen-Image's chat
template; the last hidden state; the template's prefix tokens (system message + "user") dropped; a batch padded
to its longest prompt with a mask (no mask when nothing is padded), at most ``max_sequence_length`` tokens
(QwenImagePipeline's default 512). The prefix length is counted with the tokenizer (34 with Qwen's own;
QwenImagePipeline hard-codes 34, ComfyUI finds the same place by searching the tokens). Text-only: the vision
tower is never run."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...base import Conditioning
from ...text_parts import TextComponents, component, loaded_device_of
from ..spec import TextEncoding
from . import ID

QWEN_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_MAX_TOKENS = 1024  # tokens after the template prefix that the tokenizer keeps
QWEN_DEFAULT_LENGTH = 512


def qwen_prefix_tokens(tokenizer) -> int:
    """Tokens of the template before the prompt (34 for Qwen2.5-VL's tokenizer)."""
    return len(tokenizer(QWEN_TEMPLATE.split("{}")[0]).input_ids)


@torch.no_grad()
def encode_qwen_image(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = QWEN_DEFAULT_LENGTH
) -> Conditioning:
    """Qwen-Image conditioning of ``prompts`` (on the encoder's device, in its dtype)."""
    drop = qwen_prefix_tokens(tokenizer)
    device = loaded_device_of(encoder)
    texts = [QWEN_TEMPLATE.format(p) for p in prompts]
    tokens = tokenizer(texts, max_length=QWEN_MAX_TOKENS + drop, padding=True, truncation=True, return_tensors="pt")
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
    hidden = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    kept = [h[m.bool()][drop:] for h, m in zip(hidden, mask)]
    length = max(k.shape[0] for k in kept)
    embeds = torch.stack([torch.cat([k, k.new_zeros(length - k.shape[0], k.shape[1])]) for k in kept])
    valid = torch.stack([torch.arange(length, device=device) < k.shape[0] for k in kept]).long()
    embeds, valid = embeds[:, :max_sequence_length], valid[:, :max_sequence_length]
    return Conditioning(embeds, None, None if bool(valid.all()) else valid)


def encode(comps: TextComponents, prompts: list[str], length: int, device: torch.device) -> Conditioning:
    encoder = component(comps, "encoder", "text_encoder", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    return encode_qwen_image(encoder, tokenizer, prompts, length).to(device)


ENCODING = TextEncoding(encode)
