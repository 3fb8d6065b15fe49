"""Wan's text encoder from ONE file, as ComfyUI's CLIPLoader (type "wan") reads it from ``models/text_encoders``:
UMT5-XXL (``umt5_xxl_fp16.safetensors``, ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``), or a llama.cpp GGUF as
ComfyUI-GGUF's CLIPLoaderGGUF reads it (``umt5-xxl-encoder-Q8_0.gguf``); the encoder itself is read by
``models.t5_text_file`` / ``models.gguf.t5_file``.

The tokenizer travels in the file: a SentencePiece model stored as the uint8 tensor ``spiece_model``, or in a
GGUF the vocabulary as ``tokenizer.ggml.*`` metadata (rebuilt by ``models.gguf.spm_tokenizer``). A prompt
is encoded as ComfyUI does for Wan (no cleaning): its pieces, the end token (1), padded with 0 to at least 512
tokens (a longer prompt is kept whole); the encoder sees the attention mask and the states of the padding are
zeroed; ComfyUI's prompt-weight syntax ``(word:1.2)`` is read as ComfyUI reads it (``models.prompt_weights``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...t5_text_file import (
    END,
    PAD,
    encode_weighted,
    file_t5_sizes,
    final_norm_dtype,
    load_t5_text_file,
    safetensors_shapes,
)
from ..spec import TextEncoderFile

TOKENIZER_KEY = "spiece_model"
MIN_LENGTH = 512  # ComfyUI pads Wan prompts to this many tokens
WHAT = "UMT5 (Wan's text encoder)"


class FileTokenizer:
    """The SentencePiece tokenizer a UMT5 file carries: prompt -> piece ids (no end token)."""

    def __init__(self, model_proto: bytes, source: str):
        import sentencepiece

        self.source = source
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)

    def ids(self, text: str) -> list[int]:
        return list(self.processor.encode(text))


def _no_tokenizer(name: str, gguf: bool = False) -> ConfigError:
    return ConfigError(
        f"{name} holds no tokenizer ({'tokenizer.ggml.* metadata' if gguf else TOKENIZER_KEY})",
        "Wan's UMT5 files carry their SentencePiece tokenizer (ComfyUI's as the tensor 'spiece_model', llama.cpp's "
        "GGUFs as tokenizer.ggml.* metadata)",
        "use Comfy-Org's umt5_xxl_fp16.safetensors / umt5_xxl_fp8_e4m3fn_scaled.safetensors, or a UMT5 GGUF "
        "converted by llama.cpp (umt5-xxl-encoder-Q8_0.gguf)",
    )


def _is_gguf(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def check_umt5_file(path: str) -> None:
    """On the host, before any worker reads it: the file holds a UMT5 encoder and its tokenizer."""
    file_t5_sizes(path, WHAT)
    if _is_gguf(path):
        from ...gguf.reader import GGUFFile

        if GGUFFile(Path(path).expanduser()).metadata.get("tokenizer.ggml.model") != "t5":
            raise _no_tokenizer(Path(path).name, gguf=True)
    elif TOKENIZER_KEY not in safetensors_shapes(path):
        raise _no_tokenizer(Path(path).name)


def umt5_tokenizer(path: str, tokenizer_dir: str | None = None) -> FileTokenizer:
    """The tokenizer stored in ``path`` (``tokenizer_dir`` is not needed): the ``spiece_model`` tensor, or a
    GGUF's tokenizer metadata rebuilt as ComfyUI-GGUF does (``gguf.spm_tokenizer``)."""
    from ...tensor_files import SafetensorsFile

    if _is_gguf(path):
        from ...gguf.spm_tokenizer import spm_model_proto, tokenizer_metadata

        name = Path(path).name
        return FileTokenizer(spm_model_proto(tokenizer_metadata(Path(path).expanduser()), name), name)

    file = SafetensorsFile(Path(path).expanduser())
    if TOKENIZER_KEY not in file.entries:
        raise _no_tokenizer(file.path.name)
    with file:
        data = file.read(TOKENIZER_KEY)
    return FileTokenizer(data.to(torch.uint8).numpy().tobytes(), file.path.name)


@torch.no_grad()
def encode_wan_file(
    encoder: nn.Module, tokenizer: FileTokenizer, prompts: Sequence[str], max_sequence_length: int = MIN_LENGTH
) -> Conditioning:
    """Wan conditioning of ``prompts`` (see the module doc; ``max_sequence_length``: the padded length). Weighted
    tokens are measured from the empty prompt (END, then padding)."""
    states, _ = encode_weighted(
        encoder, tokenizer.ids, prompts, max_sequence_length, True, lambda n: [END] + [PAD] * (n - 1)
    )
    return Conditioning(states)


def load_umt5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The UMT5 encoder of ``path`` (.safetensors or .gguf), its weights held as ComfyUI's CLIPLoader type wan
    holds them: in the dtype of the file's final norm (``dtype``, the model's, is not used; T5 computes in
    float32 either way)."""
    return load_t5_text_file(path, device, final_norm_dtype(path), storage, overrides, what=WHAT)


ENCODER_FILE = TextEncoderFile(
    "UMT5", load_umt5_file, encode_wan_file, MIN_LENGTH, tokenizer=umt5_tokenizer, check=check_umt5_file
)
