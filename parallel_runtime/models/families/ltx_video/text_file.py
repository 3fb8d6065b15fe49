"""LTX-Video's text encoder from ONE file, as ComfyUI's CLIPLoader (type "ltxv") reads it from
``models/text_encoders``: T5-XXL (``t5xxl_fp16.safetensors``, ``t5xxl_fp8_e4m3fn_scaled.safetensors``, or a T5-XXL
encoder GGUF as ComfyUI-GGUF's CLIPLoaderGGUF reads it; the encoder itself is read by ``models.t5_text_file``), the
tokenizer ComfyUI's own ``t5_tokenizer`` folder.

ComfyUI encodes an LTX-Video prompt unlike LTXPipeline (whose T5 runs without a mask, ``text.py``): the prompt's
tokens and the end token, padded with 0 to at least 128 tokens (a longer prompt is kept whole), the encoder run WITH
the attention mask (1 up to and including the end token), the padding's states kept as the encoder gives them, and
the mask handed on in the CONDITIONING for the transformer's cross-attention; no pooled output. ComfyUI's
``(word:1.2)`` weights are measured from the empty prompt (the end token, then padding). The weights are held in
float16, as ComfyUI's CLIPLoader holds a text encoder (T5 computes in float32 either way).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...base import Conditioning
from ...t5_text_file import (
    END,
    PAD,
    check_t5xxl_file,
    encode_weighted,
    folder_tokenizer_ids,
    load_t5_text_file,
)
from ..spec import TextEncoderFile

WHAT = "T5-XXL (LTX-Video's text encoder)"
MIN_LENGTH = 128  # ComfyUI pads LTX-Video prompts to this many tokens


def load_ltxv_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights in float16 (``dtype``, the model's, is not used)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


@torch.no_grad()
def encode_ltxv_file(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = MIN_LENGTH
) -> Conditioning:
    """LTX-Video conditioning of ``prompts`` (see the module doc; ``max_sequence_length``: the padded length):
    the states and the token mask."""
    states, mask = encode_weighted(
        encoder,
        folder_tokenizer_ids(tokenizer),
        prompts,
        max_sequence_length,
        True,
        lambda n: [END] + [PAD] * (n - 1),
        zero_padding=False,
    )
    return Conditioning(states, None, mask.to(states.device))


ENCODER_FILE = TextEncoderFile(
    "T5-XXL", load_ltxv_t5_file, encode_ltxv_file, MIN_LENGTH, check=lambda path: check_t5xxl_file(path, WHAT)
)
