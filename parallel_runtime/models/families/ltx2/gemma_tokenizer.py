"""Gemma's tokenizer as ComfyUI's Gemma-3 files carry it: the SentencePiece model stored in the file as the uint8
tensor ``spiece_model`` (what ComfyUI's LTX-2 Gemma tokenizer reads: a beginning-of-text token first, no end token).
Called as ``text.encode`` calls a transformers tokenizer: a batch padded to ``max_length`` on ``padding_side``, with
its attention mask."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch

from ...tensor_files import SafetensorsFile

TOKENIZER_KEY = "spiece_model"


class SentencePieceGemmaTokenizer:
    """The SentencePiece model ``model_proto``: prompt -> [bos] + pieces, truncated and padded to a length."""

    def __init__(self, model_proto: bytes, source: str):
        import sentencepiece

        self.source = source
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.padding_side = "right"
        pad = self.processor.pad_id()
        self.pad_token = self.processor.id_to_piece(pad) if pad >= 0 else None
        self.eos_token = self.processor.id_to_piece(self.processor.eos_id())

    def ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        bos = [self.processor.bos_id()] if add_special_tokens and self.processor.bos_id() >= 0 else []
        return bos + list(self.processor.encode(text))

    def __call__(
        self,
        texts: str | Sequence[str],
        padding: str = "max_length",
        max_length: int = 1024,
        truncation: bool = True,
        add_special_tokens: bool = True,
        return_tensors: str = "pt",
    ) -> SimpleNamespace:
        texts = [texts] if isinstance(texts, str) else list(texts)
        pad = self.processor.piece_to_id(self.pad_token if self.pad_token is not None else self.eos_token)
        ids, mask = [], []
        for text in texts:
            tokens = self.ids(text, add_special_tokens)
            tokens = tokens[:max_length] if truncation else tokens
            fill = max(max_length - len(tokens), 0) if padding == "max_length" else 0
            left = self.padding_side == "left"
            ids.append([pad] * fill * left + tokens + [pad] * fill * (not left))
            mask.append([0] * fill * left + [1] * len(tokens) + [0] * fill * (not left))
        return SimpleNamespace(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))


def file_tokenizer(path: str | os.PathLike) -> SentencePieceGemmaTokenizer | None:
    """The tokenizer a Gemma-3 safetensors file carries (None: it carries none)."""
    if not str(path).lower().endswith((".safetensors", ".sft")):
        return None
    file = SafetensorsFile(Path(path).expanduser())
    if TOKENIZER_KEY not in file.entries:
        return None
    with file:
        data = file.read(TOKENIZER_KEY)
    return SentencePieceGemmaTokenizer(data.to(torch.uint8).numpy().tobytes(), file.path.name)
