"""Flux.1's text encoders from TWO files, as ComfyUI's DualCLIPLoader (type "flux") reads them: T5-XXL
(``t5xxl_fp16.safetensors``, ``t5xxl_fp8_e4m3fn_scaled.safetensors``, or a T5-XXL encoder GGUF as ComfyUI-GGUF's
DualCLIPLoaderGGUF reads it; read by ``models.t5_text_file``) and CLIP-L (``clip_l.safetensors``; read by
``models.clip_text_file``). The conditioning is T5's hidden states, its pooled output CLIP-L's (not projected).
T5: a prompt's tokens and the end token, padded with 0 to at least 256 tokens, no attention mask (the padding's
states are kept), ComfyUI's ``(word:1.2)`` weights as it reads them; tokenizer ComfyUI's ``t5_tokenizer``. CLIP-L:
see ``clip_text_file``; tokenizer ComfyUI's ``sd1_tokenizer``. Both hold their weights in float16, as ComfyUI.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...base import Conditioning
from ...clip_text_file import check_clip_l_file, clip_pooled, is_clip_text_file, load_clip_l_file
from ...t5_text_file import END, PAD, check_t5xxl_file, encode_weighted, folder_tokenizer_ids, load_t5_text_file
from ..spec import SecondEncoderFile, TextEncoderFile

WHAT = "T5-XXL (Flux.1's text encoder)"
CLIP_WHAT = "CLIP-L (Flux.1's second text encoder)"
MIN_LENGTH = 256  # ComfyUI's Flux T5 tokenizer pads to this many tokens


@torch.no_grad()
def encode_flux_files(encoders, tokenizers, prompts: Sequence[str], max_sequence_length: int = MIN_LENGTH):
    """Flux.1 conditioning of ``prompts`` from (T5, CLIP-L) ``encoders`` and their ``tokenizers``
    (``max_sequence_length``: T5's least padded length); weighted T5 tokens are measured from the empty prompt."""
    t5, clip = encoders
    t5_tokenizer, clip_tokenizer = tokenizers
    empty = lambda n: [END] + [PAD] * (n - 1)  # noqa: E731
    states, _ = encode_weighted(t5, folder_tokenizer_ids(t5_tokenizer), prompts, max_sequence_length, False, empty)
    pooled = torch.cat([clip_pooled(clip, clip_tokenizer, p) for p in prompts])
    return Conditioning(states, pooled.to(states.device))


def load_flux_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights held as ComfyUI holds a Flux T5: in float16 (its text-encoder
    dtype; ``dtype``, the model's, is not used; T5 computes in float32 either way)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


CLIP_L = SecondEncoderFile(
    "CLIP-L",
    lambda path, device: load_clip_l_file(path, device, CLIP_WHAT),
    lambda path: check_clip_l_file(path, CLIP_WHAT),
    is_clip_text_file,
)

ENCODER_FILE = TextEncoderFile(
    "T5-XXL",
    load_flux_t5_file,
    encode_flux_files,
    MIN_LENGTH,
    check=lambda path: check_t5xxl_file(path, WHAT),
    second=CLIP_L,
)
