"""FLUX.2's Mistral text encoder from a llama.cpp GGUF (general.architecture "llama", e.g.
``Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf``), the files ComfyUI-GGUF's CLIPLoaderGGUF reads for FLUX.2.

- Names: llama.cpp's (``blk.N.attn_q.weight``), found through the ``gguf`` package's tensor map (``gguf.text_model``).
- Query / key rows: llama.cpp's converter reorders each head's rows from the rotate-half layout transformers uses
  to interleaved pairs (row ``s * d/2 + i`` of a ``d``-row head goes to ``2 * i + s``); they are put back here, by
  rows, so quantised weights stay in their GGML blocks (a block never spans rows). The head counts are the file's
  (``llama.attention.head_count`` / ``head_count_kv``).
- Sizes the weights do not show (head width, RoPE base, norm epsilon) come from the file's ``llama.*`` metadata.
- Tokenizer: llama.cpp keeps Mistral's byte-level vocabulary as ``tokenizer.ggml.tokens`` (GPT-2's byte-to-letter
  spelling) with the special tokens marked as control tokens, and names tekken's pre-tokenizer
  (``tokenizer.ggml.pre`` "tekken"); a tekken.json is made of them (specials at their ids, the rest ranked in id
  order, tekken's split pattern) and read as the safetensors file's ``tekken_model`` is.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ....errors import ConfigError

# tekken's split pattern (Mistral's tekken.json "pattern"), which tokenizer.ggml.pre "tekken" names
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CONTROL_TOKEN = 3  # llama.cpp's token type of a special token
METADATA_CONFIG = {  # config field -> the llama.cpp metadata key holding it
    "head_dim": "llama.attention.key_length",
    "rope_theta": "llama.rope.freq_base",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
}
ARCHITECTURE = "llama"
WHAT = "Mistral Small 3 (FLUX.2's text encoder)"


def open_mistral_gguf(path: str | Path):
    """The GGUF file, when it holds a llama-architecture model; a ConfigError naming what it holds otherwise."""
    from ...gguf.reader import GGUFFile
    from ...gguf.text_model import check_text_architecture

    file = GGUFFile(Path(path).expanduser())
    check_text_architecture(file, (ARCHITECTURE,), WHAT)
    return file


def gguf_overrides(file, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config values the file's metadata gives, ``overrides`` over them."""
    found = {field: file.metadata[key] for field, key in METADATA_CONFIG.items() if key in file.metadata}
    return {**found, **(overrides or {})}


def gguf_shapes(file, prefix: str) -> dict[str, tuple[int, ...]]:
    """The shapes ``mistral_text_config`` reads, under ComfyUI's names (one ``layers.N.`` entry a block)."""
    from ...gguf.text_model import probe_shapes

    probe = ["embed_tokens.weight", "layers.0.mlp.gate_proj.weight"]
    probe += [f"layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj")]
    return probe_shapes(file, prefix, probe)


def gguf_source_fields(file, names: Mapping[str, str]) -> dict[str, Any]:
    """``text_source_fields`` of ``names`` (model name -> the file's tensor name), query and key rows put back in
    transformers' order."""
    from ...gguf.text_model import text_source_fields

    heads = {"q_proj": "llama.attention.head_count", "k_proj": "llama.attention.head_count_kv"}
    orders = {}
    for name, stored in names.items():
        projection = name.split(".")[-2] if name.endswith(".weight") or name.endswith(".bias") else ""
        if projection in heads and stored in file.tensors:
            count = file.metadata.get(heads[projection])
            orders[name] = rotate_half_order(file.tensors[stored].shape[0], count, file.path.name)
    fields = text_source_fields(file, names)
    read_stored = fields["read"]

    def read(wanted: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, data in read_stored(wanted):
            yield name, data[orders[name]] if name in orders else data

    return {**fields, "read": read}


def rotate_half_order(rows: int, heads: Any, name: str) -> torch.Tensor:
    """Row ``j`` of transformers' weight is row ``order[j]`` of llama.cpp's (see the module doc)."""
    if not isinstance(heads, int) or heads <= 0 or rows % (2 * heads):
        raise ConfigError(
            f"{name}: {rows} query / key rows cannot be {heads!r} heads of rotary pairs",
            "llama.cpp stores each head's rows in interleaved pairs; the head counts come from the file's "
            "llama.attention.head_count / head_count_kv",
            "use a GGUF converted by llama.cpp's convert_hf_to_gguf.py",
        )
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)


def tekken_json_of(path: str | Path) -> bytes:
    """A tekken.json (bytes) made of the GGUF's tokenizer metadata (see the module doc)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from ...gguf.spm_tokenizer import tokenizer_metadata

    name = Path(path).name
    meta = tokenizer_metadata(Path(path).expanduser())
    tokens = meta.get("tokenizer.ggml.tokens") or []
    kinds = meta.get("tokenizer.ggml.token_type") or []
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre != "tekken" or not tokens or len(kinds) != len(tokens):
        raise ConfigError(
            f"{name} holds no tekken tokenizer (tokenizer.ggml.model {model!r}, pre {pre!r}, {len(tokens)} tokens)",
            "a Mistral Small 3 GGUF carries its byte-level vocabulary as tokenizer.ggml.* metadata, pre-tokenizer "
            "'tekken'",
            "use a Mistral Small 3.1 / 3.2 GGUF converted by llama.cpp, or mistral_3_small_flux2*.safetensors",
        )
    specials = sum(1 for kind in kinds if kind == CONTROL_TOKEN)
    if any(kind != CONTROL_TOKEN for kind in kinds[:specials]):
        raise ConfigError(
            f"{name}: its control tokens are not the first {specials} ids",
            "tekken numbers its special tokens first, then the byte-level vocabulary",
            "use a Mistral Small 3.1 / 3.2 GGUF converted by llama.cpp",
        )
    letter_byte = {letter: byte for byte, letter in bytes_to_unicode().items()}
    try:
        spelled = [bytes(letter_byte[c] for c in token) for token in tokens[specials:]]
    except KeyError as exc:
        raise ConfigError(
            f"{name}: token {exc} is not spelled in GPT-2's byte letters",
            "a byte-level vocabulary spells every byte as one letter",
            "use a Mistral Small 3.1 / 3.2 GGUF converted by llama.cpp",
        ) from None
    config = {
        "pattern": TEKKEN_PATTERN,
        "num_vocab_tokens": len(spelled),
        "default_vocab_size": len(tokens),
        "default_num_special_tokens": specials,
    }
    return json.dumps(
        {
            "config": config,
            "vocab": [
                {"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
                for r, b in enumerate(spelled)
            ],
            "special_tokens": [{"rank": i, "token_str": tokens[i], "is_control": True} for i in range(specials)],
        }
    ).encode()
