"""HunyuanVideo 1.5's text encoders from TWO files in ``models/text_encoders``: Qwen2.5-VL 7B (ComfyUI's
``qwen_2.5_vl_7b*.safetensors`` / a Qwen2.5-VL GGUF, read by ``models.qwen25_text_file``) and the
ByT5 glyph encoder (``byt5_small_glyphxl_fp16.safetensors``, the Glyph-SDXL-v2 ByT5 of the release, as ComfyUI keeps
it for HunyuanImage 2.1: T5's original names, read by ``models.t5_text_file``). Tokenizers are folders: ComfyUI's
``qwen25_tokenizer`` (with its chat template) and ``byt5_tokenizer`` (with the glyph tokens).

ComfyUI 0.3.64 has no HunyuanVideo 1.5, so the prompts are encoded as HunyuanVideo15Pipeline encodes them
(``text.py``: the chat template, the third-last layer after the template, the quoted text through ByT5), with the
encoders read from these files; the oracle is the pipeline's ``encode_prompt`` on the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...qwen25_text_file import check_qwen25_file, load_qwen25_text_file
from ...t5_text_file import file_t5_sizes, final_norm_dtype, load_t5_text_file, safetensors_shapes
from ..spec import SecondEncoderFile, TextEncoderFile
from .text import encode

BYT5_WHAT = "ByT5 (HunyuanVideo 1.5's glyph text encoder)"
DEFAULT_LENGTH = 1000  # the pipeline's prompt tokens after the template


class GlyphEncoder(nn.Module):
    """A T5 encoder read from a file, called as transformers' T5EncoderModel is: (input_ids, attention_mask) ->
    (states,), with ``config.d_model``."""

    def __init__(self, t5: nn.Module):
        super().__init__()
        self.t5 = t5
        self.config = SimpleNamespace(d_model=t5.sizes.width)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        mask = None if attention_mask is None else attention_mask.long()
        return (self.t5(input_ids, mask).float(),)


def load_byt5_file(path: str, device="cpu") -> nn.Module:
    """The glyph ByT5 encoder of ``path``, its weights in the file's dtype (T5 computes in float32)."""
    return GlyphEncoder(load_t5_text_file(path, device, final_norm_dtype(path), what=BYT5_WHAT))


def is_t5_file(path: str) -> bool:
    """Whether ``path`` holds a T5 encoder under T5's original names (not a Qwen / Llama file)."""
    if str(path).lower().endswith(".gguf"):
        return False
    return "encoder.final_layer_norm.weight" in safetensors_shapes(path)


def check_byt5_file(path: str) -> None:
    """On the host: ``path`` holds a T5 encoder (ByT5's)."""
    if not is_t5_file(path):
        raise ConfigError(
            f"{Path(path).name} holds no T5 encoder (encoder.final_layer_norm)",
            f"HunyuanVideo 1.5 reads {BYT5_WHAT} beside its Qwen2.5-VL",
            "pick byt5_small_glyphxl_fp16.safetensors as text_encoder_2",
        )
    file_t5_sizes(path, BYT5_WHAT)


class _FileComponents:
    """The two files' encoders and tokenizers in the shape ``text.encode`` reads."""

    def __init__(self, encoders, tokenizers):
        self.path = Path("text encoder files")
        self.pipeline_class = "HunyuanVideo15Pipeline"
        self.transformer_config = {}
        self.text_encoders = {"text_encoder": encoders[0], "text_encoder_2": encoders[1]}
        self.tokenizers = {"tokenizer": tokenizers[0], "tokenizer_2": tokenizers[1]}


@torch.no_grad()
def encode_hunyuan_video15_files(
    encoders, tokenizers, prompts: Sequence[str], max_sequence_length: int = DEFAULT_LENGTH
) -> Conditioning:
    """HunyuanVideo 1.5 conditioning of ``prompts`` from (Qwen2.5-VL, ByT5) ``encoders`` and ``tokenizers``."""
    device = next(encoders[0].parameters()).device
    return encode(_FileComponents(encoders, tokenizers), list(prompts), max_sequence_length, device)


BYT5 = SecondEncoderFile("ByT5", load_byt5_file, check_byt5_file, is_t5_file)

ENCODER_FILE = TextEncoderFile(
    "Qwen2.5-VL", load_qwen25_text_file, encode_hunyuan_video15_files, DEFAULT_LENGTH, check=check_qwen25_file,
    second=BYT5,
)  # fmt: skip
