"""PixArt's text encoder from ONE file, as ComfyUI's CLIPLoader (type "pixart") reads it: T5-XXL
(``t5xxl_fp16.safetensors``, ``t5xxl_fp8_e4m3fn_scaled.safetensors``, or a T5-XXL encoder GGUF as ComfyUI-GGUF's
CLIPLoaderGGUF reads it; the encoder itself is read by ``models.t5_text_file``), the tokenizer ComfyUI's own
``t5_tokenizer`` folder. ComfyUI encodes a PixArt prompt unlike the PixArt pipelines (lower-cased, 120 / 300 padded
tokens with a mask): its tokens and the end token as written, no padding, no attention mask, ComfyUI's
``(word:1.2)`` weights (``t5_text_file.encode_unpadded``); the weights held in float16 as ComfyUI holds them.
"""

from __future__ import annotations

import torch
from torch import nn

from ...t5_text_file import check_t5xxl_file, encode_unpadded, load_t5_text_file
from ..spec import TextEncoderFile

WHAT = "T5-XXL (PixArt's text encoder)"


def load_pixart_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights in float16 (``dtype``, the model's, is not used; T5 computes in
    float32 either way)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


ENCODER_FILE = TextEncoderFile(
    "T5-XXL", load_pixart_t5_file, encode_unpadded, 1, check=lambda path: check_t5xxl_file(path, WHAT)
)
