"""Z-Image's text encoder from ONE file, as ComfyUI keeps it in ``models/text_encoders``.

Qwen3-4B (``qwen_3_4b.safetensors``, Comfy-Org's repackaging): Hugging Face's Qwen3 names under ``model.``
(``model.layers.N.self_attn.q_proj.weight``, ``...q_norm.weight``, ``model.embed_tokens.weight``,
``model.norm.weight``), no LM head. transformers' ``Qwen3Model`` is built with the sizes of the header (the head
width from ``q_norm``) and the rest of Qwen3-4B's config. fp8 files keep their Linear layers in fp8 as
transformers does (``fp8.Fp8Linear``); a llama.cpp GGUF (general.architecture "qwen3", e.g. ``Qwen3-4B-Q8_0.gguf``,
as ComfyUI-GGUF's CLIPLoaderGGUF reads it) keeps them in their GGML blocks (``gguf.GGUFLinear``; its names from
the ``gguf`` package's tensor map, RoPE base and norm epsilon from its ``qwen3.*`` metadata). The tokenizer is a folder: ComfyUI's own ``qwen25_tokenizer`` serves (Qwen3
shares Qwen2.5's vocabulary, and the chat-template tokens Z-Image uses are in both), or a diffusers one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...prefixed_text_file import decoder_config, load_prefixed_model
from ...weights import parameters_on_meta
from ..spec import TextEncoderFile
from .text import DEFAULT_LENGTH, encode_z_image

QWEN3_4B: Mapping[str, Any] = {  # Qwen/Qwen3-4B's config: what the weights do not show
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 40960,
    "hidden_act": "silu",
}
TEXT_PREFIX = "model."


def qwen3_text_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The Qwen3 config of a ComfyUI text-encoder file, from its header (``overrides``: e.g. a norm epsilon)."""
    base = {**QWEN3_4B, **(overrides or {})}
    key = TEXT_PREFIX + "layers.0.self_attn.{}.weight"
    if TEXT_PREFIX + "embed_tokens.weight" not in shapes or key.format("q_norm") not in shapes:
        raise ConfigError(
            "the file does not hold a Qwen3 text model (no model.embed_tokens / model.layers.0.self_attn.q_norm)",
            "Z-Image's text encoder is Qwen3-4B, stored by ComfyUI under 'model.'",
            "pick qwen_3_4b*.safetensors from models/text_encoders",
        )
    layers = len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")})
    return decoder_config(shapes, TEXT_PREFIX, shapes[key.format("q_norm")][0], layers, base)


def load_qwen3_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The Qwen3 text model in ComfyUI's ``path`` (see the module doc), on ``device``."""
    from transformers import Qwen3Config, Qwen3Model

    if str(path).lower().endswith(".gguf"):
        return _load_qwen3_gguf(path, device, dtype, storage, overrides)

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        return Qwen3Model(Qwen3Config(**qwen3_text_config(shapes, overrides)))

    return load_prefixed_model(path, TEXT_PREFIX, build, device, dtype, storage, comfy_fp8_layers=False)


def _load_qwen3_gguf(path, device, dtype: torch.dtype, storage: str, overrides) -> nn.Module:
    """The Qwen3 text model of a llama.cpp GGUF (see the module doc)."""
    from transformers import Qwen3Config, Qwen3Model

    from ...gguf.reader import GGUFFile
    from ...gguf.text_model import load_llama_cpp_model

    file = GGUFFile(Path(path).expanduser())
    with parameters_on_meta():
        model = Qwen3Model(Qwen3Config(**qwen3_text_config(_gguf_shapes(file), _gguf_overrides(file, overrides))))
    return load_llama_cpp_model(model, file, TEXT_PREFIX, device, dtype, storage)


def _gguf_shapes(file) -> dict[str, tuple[int, ...]]:
    """The shapes ``qwen3_text_config`` reads, under ComfyUI's names, of a qwen3 GGUF (a ConfigError naming the
    file's architecture when it is another)."""
    from ...gguf.text_model import check_text_architecture, probe_shapes

    check_text_architecture(file, ("qwen3",), "Qwen3 (Z-Image's text encoder)")
    probe = ["embed_tokens.weight", "layers.0.mlp.gate_proj.weight"]
    probe += [f"layers.0.self_attn.{p}.weight" for p in ("q_norm", "q_proj", "k_proj")]
    return probe_shapes(file, TEXT_PREFIX, probe)


def _gguf_overrides(file, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The file's RoPE base and norm epsilon (llama.cpp's qwen3.* metadata), ``overrides`` over them."""
    keys = {"rope_theta": "qwen3.rope.freq_base", "rms_norm_eps": "qwen3.attention.layer_norm_rms_epsilon"}
    return {**{f: file.metadata[k] for f, k in keys.items() if k in file.metadata}, **(overrides or {})}


def check_qwen3_file(path: str) -> None:
    """On the host, before any worker reads it: the file holds a Qwen3 text model (a GGUF: of architecture
    qwen3)."""
    from ...gguf.reader import GGUFFile
    from ...tensor_files import SafetensorsFile

    if str(path).lower().endswith(".gguf"):
        qwen3_text_config(_gguf_shapes(GGUFFile(Path(path).expanduser())))
    else:
        qwen3_text_config({k: e.shape for k, e in SafetensorsFile(Path(path).expanduser()).entries.items()})


ENCODER_FILE = TextEncoderFile("Qwen3", load_qwen3_text_file, encode_z_image, DEFAULT_LENGTH, check=check_qwen3_file)
