"""FLUX.2's Mistral text encoder from a llama.cpp GGUF (general.architecture "llama", e.g.
``Mistral-Small-3.2-24B-Instruct-2506-Q4_K_M.gguf``), the files ComfyUI-GGUF's CLIPLoaderGGUF reads for FLUX.2.

- Names: llama.cpp's (``blk.N.attn_q.weight``), found through the ``gguf`` package's tensor map (``gguf.text_model``).
- Query / key rows and the sizes the weights do not show: read as for every llama-architecture GGUF
  (``models.gguf.llama_text``).
- Tokenizer: llama.cpp keeps Mistral's byte-level vocabulary as ``tokenizer.ggml.tokens`` (GPT-2's byte-to-letter
  spelling) with the special tokens marked as control tokens, and names tekken's pre-tokenizer
  (``tokenizer.ggml.pre`` "tekken"); a tekken.json is made of them (specials at their ids, the rest ranked in id
  order, tekken's split pattern) and read as the safetensors file's ``tekken_model`` is.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from ....errors import ConfigError

# tekken's split pattern (Mistral's tekken.json "pattern"), which tokenizer.ggml.pre "tekken" names
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CONTROL_TOKEN = 3  # llama.cpp's token type of a special token
ARCHITECTURE = "llama"
WHAT = "Mistral Small 3 (FLUX.2's text encoder)"


def open_mistral_gguf(path: str | Path):
    """The GGUF file, when it holds a llama-architecture model; a ConfigError naming what it holds otherwise."""
    from ...gguf.reader import GGUFFile
    from ...gguf.text_model import check_text_architecture

    file = GGUFFile(Path(path).expanduser())
    check_text_architecture(file, (ARCHITECTURE,), WHAT)
    return file


def gguf_shapes(file, prefix: str) -> dict[str, tuple[int, ...]]:
    """The shapes ``mistral_text_config`` reads, under ComfyUI's names (one ``layers.N.`` entry a block)."""
    from ...gguf.text_model import probe_shapes

    probe = ["embed_tokens.weight", "layers.0.mlp.gate_proj.weight"]
    probe += [f"layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj")]
    return probe_shapes(file, prefix, probe)


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
