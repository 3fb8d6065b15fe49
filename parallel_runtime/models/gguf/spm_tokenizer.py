"""A SentencePiece tokenizer rebuilt from a GGUF file's ``tokenizer.ggml.*`` metadata (llama.cpp's T5 / UMT5
files keep no tokenizer.model), as ComfyUI-GGUF's CLIPLoaderGGUF rebuilds it for UMT5-XXL.

The model holds what the metadata gives and nothing else: every piece with its score and type, the unigram
algorithm (SentencePiece's default), ``add_space_prefix`` / ``remove_extra_whitespaces`` as the normaliser's
dummy prefix / whitespace folding (no normalisation table: the original's NFKC map is not in the file),
byte fallback on, the end and padding ids. The bytes are the SentencePiece ``ModelProto`` message, written here
in protobuf's wire format (field numbers of sentencepiece_model.proto), so no protobuf package is needed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError

# sentencepiece_model.proto field numbers
MODEL_PIECES, MODEL_TRAINER, MODEL_NORMALIZER = 1, 2, 3
PIECE_TEXT, PIECE_SCORE, PIECE_TYPE = 1, 2, 3
TRAINER_VOCAB, TRAINER_MAX_SENTENCE, TRAINER_BYTE_FALLBACK, TRAINER_EOS, TRAINER_PAD = 4, 18, 35, 42, 43
NORMALIZER_DUMMY_PREFIX, NORMALIZER_FOLD_SPACES = 3, 4
VARINT, FIXED32, BYTES = 0, 5, 2


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32 values take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _message(field: int, body: bytes) -> bytes:
    return _key(field, BYTES) + _varint(len(body)) + body


def _int(field: int, value: int) -> bytes:
    return _key(field, VARINT) + _varint(int(value))


def spm_model_proto(metadata: Mapping[str, Any], name: str) -> bytes:
    """The serialized SentencePiece model of ``metadata`` (a GGUF file's ``tokenizer.ggml.*`` keys; ``name``:
    the file, for messages)."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if kind != "t5" or not tokens:
        raise ConfigError(
            f"{name} holds no T5 tokenizer (tokenizer.ggml.model {kind!r}, {len(tokens or [])} tokens)",
            "a T5 / UMT5 GGUF carries its SentencePiece vocabulary as tokenizer.ggml.* metadata",
            "use a T5 / UMT5 encoder GGUF converted by llama.cpp (e.g. umt5-xxl-encoder-Q8_0.gguf)",
        )
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    body = bytearray()
    for text, score, kind_id in zip(tokens, scores, types):
        piece = _message(PIECE_TEXT, text.encode("utf-8"))  # a string is length-delimited as a message is
        piece += _key(PIECE_SCORE, FIXED32) + struct.pack("<f", float(score))
        piece += _int(PIECE_TYPE, int(kind_id))
        body += _message(MODEL_PIECES, piece)
    trainer = _int(TRAINER_VOCAB, len(tokens)) + _int(TRAINER_MAX_SENTENCE, 4096) + _int(TRAINER_BYTE_FALLBACK, 1)
    trainer += _int(TRAINER_EOS, metadata.get("tokenizer.ggml.eos_token_id", 1))
    trainer += _int(TRAINER_PAD, metadata.get("tokenizer.ggml.padding_token_id", 0))
    body += _message(MODEL_TRAINER, trainer)
    normalizer = _int(NORMALIZER_DUMMY_PREFIX, bool(metadata.get("tokenizer.ggml.add_space_prefix", True)))
    normalizer += _int(NORMALIZER_FOLD_SPACES, bool(metadata.get("tokenizer.ggml.remove_extra_whitespaces", True)))
    body += _message(MODEL_NORMALIZER, normalizer)
    return bytes(body)


def tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` metadata of a GGUF file, vocabulary arrays included."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
