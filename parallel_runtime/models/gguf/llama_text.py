"""Llama-architecture text models in llama.cpp GGUF files (general.architecture "llama": Mistral Small 3, Llama 3,
LLaVA-Llama-3), as the text encoders read them.

- Query / key rows: llama.cpp's converter reorders each head's rows from the rotate-half layout transformers uses
  to interleaved pairs (row ``s * d/2 + i`` of a ``d``-row head goes to ``2 * i + s``); they are put back here, by
  rows, so quantised weights stay in their GGML blocks (a block never spans rows). The head counts are the file's
  (``llama.attention.head_count`` / ``head_count_kv``).
- Sizes the weights do not show (head width, RoPE base, norm epsilon) come from the file's ``llama.*`` metadata.

:func:`open_llama_gguf` / :func:`load_llama_gguf` read such a file for a family's Llama encoder (HunyuanVideo 1.0's
LLaVA-Llama-3, HiDream-I1's Llama-3.1), which gives its config from the shapes under Hugging Face's names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError

PROBE = (  # the tensors a family's config reads from a header (Hugging Face's names, under the family's prefix)
    "embed_tokens.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
)
METADATA_CONFIG = {  # config field -> the llama.cpp metadata key holding it
    "head_dim": "llama.attention.key_length",
    "rope_theta": "llama.rope.freq_base",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
}


def llama_gguf_overrides(file, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config values the file's metadata gives, ``overrides`` over them."""
    found = {field: file.metadata[key] for field, key in METADATA_CONFIG.items() if key in file.metadata}
    return {**found, **(overrides or {})}


def llama_gguf_source_fields(file, names: Mapping[str, str]) -> dict[str, Any]:
    """``text_source_fields`` of ``names`` (model name -> the file's tensor name), query and key rows put back in
    transformers' order."""
    from .text_model import text_source_fields

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


def open_llama_gguf(path, prefix: str, what: str):
    """(the llama-architecture GGUF ``path``, the shapes of its :data:`PROBE` tensors under ``prefix`` and one
    ``{prefix}layers.N.`` entry a block); a ConfigError naming the architecture for any other GGUF."""
    from .reader import GGUFFile
    from .text_model import check_text_architecture, probe_shapes

    file = GGUFFile(Path(path).expanduser())
    check_text_architecture(file, ("llama",), what)
    return file, probe_shapes(file, prefix, PROBE)


def load_llama_gguf(
    path,
    prefix: str,
    what: str,
    config_of: Callable[[Mapping[str, tuple[int, ...]], Mapping[str, Any]], Mapping[str, Any]],
    device,
    dtype: torch.dtype,
    storage: str,
    overrides: Mapping[str, Any] | None,
):
    """transformers' ``LlamaModel`` of the llama.cpp GGUF ``path`` (as ComfyUI-GGUF's CLIP loaders read it): its
    config ``config_of(shapes, overrides)``, the head width, RoPE base and norm epsilon from the file's metadata
    under ``overrides``; Linear weights kept in their GGML blocks, query / key rows in transformers' order."""
    from transformers import LlamaConfig, LlamaModel

    from ..weights import parameters_on_meta
    from .text_model import load_llama_cpp_model

    file, shapes = open_llama_gguf(path, prefix, what)
    with parameters_on_meta():
        model = LlamaModel(LlamaConfig(**config_of(shapes, llama_gguf_overrides(file, overrides))))
    return load_llama_cpp_model(model, file, prefix, device, dtype, storage, llama_gguf_source_fields)
