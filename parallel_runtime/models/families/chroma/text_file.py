"""Chroma's text encoder from ONE file, as ComfyUI's CLIPLoader (type "chroma") reads it: T5-XXL
(``t5xxl_fp16.safetensors``, ``t5xxl_fp8_e4m3fn_scaled.safetensors``, or a T5-XXL encoder GGUF as ComfyUI-GGUF's
CLIPLoaderGGUF reads it; the encoder itself is read by ``models.t5_text_file``). The tokenizer is ComfyUI's own
``t5_tokenizer`` folder. A prompt is encoded as ComfyUI does for Chroma: its tokens and the end token, no padding,
no attention mask; no pooled output; ComfyUI's ``(word:1.2)`` weights as it reads them (ComfyUI reads Chroma's T5
as PixArt's: ``t5_text_file.encode_unpadded``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...t5_text_file import check_t5xxl_file, encode_unpadded, load_t5_text_file
from ..spec import TextEncoderFile

WHAT = "T5-XXL (Chroma's text encoder)"


def load_chroma_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights held as ComfyUI holds a Chroma T5: in float16 (its text-encoder
    dtype; ``dtype``, the model's, is not used; T5 computes in float32 either way)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


ENCODER_FILE = TextEncoderFile(
    "T5-XXL", load_chroma_t5_file, encode_unpadded, 1, check=lambda path: check_t5xxl_file(path, WHAT)
)
