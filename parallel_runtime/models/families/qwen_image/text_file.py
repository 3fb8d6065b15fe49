"""Qwen-Image's text encoder from ONE file in ``models/text_encoders``: Qwen2.5-VL 7B (read by
``models.qwen25_text_file``), prompts encoded as ComfyUI's Qwen-Image text encoder does (``text.py``). The tokenizer
is a folder (ComfyUI's own ``comfy/text_encoders/qwen25_tokenizer``, or a diffusers one).
"""

from __future__ import annotations

from ...qwen25_text_file import check_qwen25_file, load_qwen25_text_file
from ..spec import TextEncoderFile
from .text import QWEN_DEFAULT_LENGTH, encode_qwen_image

ENCODER_FILE = TextEncoderFile(
    "Qwen2.5-VL", load_qwen25_text_file, encode_qwen_image, QWEN_DEFAULT_LENGTH, check=check_qwen25_file
)
