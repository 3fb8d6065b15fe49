"""SD3's text encoder from ONE T5-XXL file, as ComfyUI's CLIPLoader (type "sd3") reads a lone
``t5xxl_fp16.safetensors`` (or ``t5xxl_fp8_e4m3fn_scaled``, or a T5-XXL encoder GGUF through ComfyUI-GGUF's
CLIPLoaderGGUF): with no CLIP-L / CLIP-G, the conditioning is T5's alone, its pooled output zeros (CLIP-L's 768
and CLIP-G's 1280 widths). A prompt is its tokens and the end token, padded with 0 to at least 77 tokens, encoded
without an attention mask (the padding's states are kept); ComfyUI's ``(word:1.2)`` weights as it reads them. The tokenizer is ComfyUI's own ``t5_tokenizer``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...base import Conditioning
from ...t5_text_file import END, PAD, check_t5xxl_file, encode_weighted, folder_tokenizer_ids, load_t5_text_file
from ..spec import TextEncoderFile

WHAT = "T5-XXL (SD3's text encoder)"
MIN_LENGTH = 77  # ComfyUI's SD3 T5 tokenizer pads to this many tokens
POOLED = 768 + 1280  # CLIP-L + CLIP-G pooled widths, zeros without those encoders


@torch.no_grad()
def encode_sd3_file(encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = MIN_LENGTH):
    """SD3 conditioning of ``prompts`` from T5 alone (``max_sequence_length``: the least padded length); weighted
    tokens are measured from the empty prompt (END, then padding)."""
    ids_of = folder_tokenizer_ids(tokenizer)
    empty = lambda n: [END] + [PAD] * (n - 1)  # noqa: E731
    states, _ = encode_weighted(encoder, ids_of, prompts, max_sequence_length, False, empty)
    return Conditioning(states, states.new_zeros(states.shape[0], POOLED))


def load_sd3_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights held as ComfyUI holds a SD3 T5: in float16 (its text-encoder
    dtype; ``dtype``, the model's, is not used; T5 computes in float32 either way)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


ENCODER_FILE = TextEncoderFile(
    "T5-XXL", load_sd3_t5_file, encode_sd3_file, MIN_LENGTH, check=lambda path: check_t5xxl_file(path, WHAT)
)
