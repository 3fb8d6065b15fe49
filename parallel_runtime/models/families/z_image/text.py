"""Z-Image prompts, as ZImagePipeline encodes them with Qwen3 (and ComfyUI's Z-Image text encoder likewise): the
prompt as one user turn of Qwen3's chat template with the assistant's turn opened (the template text is fixed
here, so a Qwen2.5 tokenizer folder such as ComfyUI's ``qwen25_tokenizer`` gives the same tokens); the second-to-last
hidden state; only the prompt's own tokens (a batch is padded on the right to its longest prompt, with a mask; no
mask when nothing is padded), at most ``max_sequence_length`` tokens (the pipeline's default 512)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...base import Conditioning
from ...text_parts import TextComponents, component, loaded_device_of
from ..spec import TextEncoding
from . import ID

Z_IMAGE_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
DEFAULT_LENGTH = 512
HIDDEN_STATE = -2  # the second-to-last hidden state (the last layer's input)


@torch.no_grad()
def encode_z_image(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = DEFAULT_LENGTH
) -> Conditioning:
    """Z-Image conditioning of ``prompts`` (on the encoder's device, in its dtype)."""
    device = loaded_device_of(encoder)
    texts = [Z_IMAGE_TEMPLATE.format(p) for p in prompts]
    tokens = tokenizer(
        texts,
        max_length=max_sequence_length,
        padding=True,
        truncation=True,
        padding_side="right",
        return_tensors="pt",
    )
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
    hidden = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[HIDDEN_STATE]
    return Conditioning(hidden, None, None if bool(mask.all()) else mask.long())


def encode(comps: TextComponents, prompts: list[str], length: int, device: torch.device) -> Conditioning:
    encoder = component(comps, "encoder", "text_encoder", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    return encode_z_image(encoder, tokenizer, prompts, length).to(device)


ENCODING = TextEncoding(encode)
