"""A tiny Mistral tokenizer in Mistral's own ``tekken.json`` format (what ComfyUI's Mistral text-encoder files
carry in their ``tekken_model`` tensor): Mistral's first special tokens at their real ranks (``<s>`` 1,
``<pad>`` 11, ``[SYSTEM_PROMPT]`` 17 ...), then a byte-level BPE vocabulary learned from the tiny corpus, ranked in
merge order (tekken's BPE merges by rank, as tiktoken does)."""

from __future__ import annotations

import base64
import json

from .big import MISTRAL_CHAT_TEMPLATE, _corpus, byte_level_bpe
from .vocab import bytes_to_unicode

MISTRAL_TEKKEN_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
PATTERN = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+"


def tekken_json() -> bytes:
    """The tiny tokenizer as the bytes of a tekken.json (version 7 layout)."""
    vocab, _ = byte_level_bpe(_corpus())
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranked = sorted(vocab.items(), key=lambda item: item[1])
    entries = [
        {"rank": rank, "token_bytes": base64.b64encode(bytes(to_byte[c] for c in token)).decode(), "token_str": None}
        for token, rank in ranked
    ]
    specials = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(MISTRAL_TEKKEN_SPECIALS)]
    config = {
        "pattern": PATTERN,
        "num_vocab_tokens": len(entries),
        "default_vocab_size": len(entries) + len(specials),
        "default_num_special_tokens": len(specials),
        "version": "v7",
    }
    return json.dumps({"config": config, "vocab": entries, "special_tokens": specials}).encode()


def tekken_tokenizer(tekken: bytes, folder, chat_template: str = MISTRAL_CHAT_TEMPLATE):
    """transformers' tokenizer of ``tekken`` (written to ``folder``/tekken.json), with Mistral's chat template
    (the way the tokenizer of a diffusers FLUX.2 folder reads chat messages)."""
    from pathlib import Path

    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    path = Path(folder) / "tekken.json"
    path.write_bytes(tekken)
    return convert_tekken_tokenizer(str(path), chat_template=chat_template)
