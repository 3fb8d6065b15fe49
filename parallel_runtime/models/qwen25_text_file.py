"""The Qwen2.5-VL 7B text model from ONE file, as ComfyUI keeps it in ``models/text_encoders``
(``qwen_2.5_vl_7b.safetensors``, ``qwen_2.5_vl_7b_fp8_scaled.safetensors``, or a llama.cpp GGUF such as
``Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf``, general.architecture "qwen2vl"); the families whose prompts it encodes
say how (their ``text_file.ENCODER_FILE``).

ComfyUI stores Hugging Face's Qwen2 names under ``model.`` (``model.layers.N.self_attn.q_proj.weight``,
``model.embed_tokens.weight``, ``model.norm.weight``) next to the vision tower (``visual.*``). Only the text
model is built (transformers' ``Qwen2_5_VLTextModel``, which gives the same hidden states as the whole
model for text-only prompts): its sizes come from the header, the rest from Qwen2.5-VL-7B's config; the
vision tower is never read here. fp8 files keep their Linear layers in fp8 as transformers do
(``fp8.Fp8Linear``), GGUF files in their GGML blocks (``gguf.GGUFLinear``; ComfyUI-GGUF's arithmetic, see
``gguf.text_model``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .prefixed_text_file import decoder_config, load_prefixed_model
from .weights import parameters_on_meta

QWEN25_VL_7B: Mapping[str, Any] = {  # Qwen/Qwen2.5-VL-7B-Instruct's text config: what the weights do not show
    "head_dim": 128,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 128000,
    "hidden_act": "silu",
    "mrope_section": [16, 24, 24],
}
TEXT_PREFIX = "model."


def qwen25_text_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The text config of a ComfyUI Qwen2.5-VL file, from its header (``overrides``: e.g. a head width)."""
    base = {**QWEN25_VL_7B, **(overrides or {})}
    key = TEXT_PREFIX + "layers.0.self_attn.{}.weight"
    if TEXT_PREFIX + "embed_tokens.weight" not in shapes or key.format("q_proj") not in shapes:
        raise ConfigError(
            "the file does not hold a Qwen2.5-VL text model (no model.embed_tokens / model.layers.0.self_attn)",
            "ComfyUI stores the Qwen2.5-VL 7B text encoder under 'model.'",
            "pick qwen_2.5_vl_7b*.safetensors from models/text_encoders",
        )
    head_dim = int(base["head_dim"])
    layers = len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")})
    mrope = list(base["mrope_section"])
    if sum(mrope) != head_dim // 2:  # other head widths: the same three-way split, scaled
        side = head_dim // 2 // 3
        mrope = [head_dim // 2 - 2 * side, side, side]
    config = decoder_config(shapes, TEXT_PREFIX, head_dim, layers, base)
    config["rope_parameters"]["mrope_section"] = mrope
    return config


def load_qwen25_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The Qwen2.5-VL text model in ComfyUI's ``path`` (see the module doc), on ``device``."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    if str(path).lower().endswith(".gguf"):
        return _load_qwen25_text_gguf(Path(path).expanduser(), device, dtype, storage, overrides)

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        return Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**qwen25_text_config(shapes, overrides)))

    return load_prefixed_model(path, TEXT_PREFIX, build, device, dtype, storage)


def _load_qwen25_text_gguf(path: Path, device, dtype: torch.dtype, storage: str, overrides) -> nn.Module:
    """The Qwen2.5-VL text model of a llama.cpp GGUF (see the module doc)."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from .gguf.reader import GGUFFile
    from .gguf.text_model import load_llama_cpp_model

    file = GGUFFile(path)
    config = Qwen2_5_VLTextConfig(**qwen25_text_config(_gguf_shapes(file), overrides))
    with parameters_on_meta():
        model = Qwen2_5_VLTextModel(config)
    return load_llama_cpp_model(model, file, TEXT_PREFIX, device, dtype, storage)


def _gguf_shapes(file) -> dict[str, tuple[int, ...]]:
    """The shapes ``qwen25_text_config`` reads, under ComfyUI's names, of a qwen2vl GGUF (a ConfigError naming
    the file's architecture when it is another)."""
    from .gguf.text_model import check_text_architecture, probe_shapes

    check_text_architecture(file, ("qwen2vl",), "Qwen2.5-VL")
    probe = ["embed_tokens.weight", *(f"layers.0.{p}.weight" for p in ("self_attn.q_proj", "self_attn.k_proj"))]
    probe += ["layers.0.mlp.gate_proj.weight"]
    return probe_shapes(file, TEXT_PREFIX, probe)


def check_qwen25_file(path: str) -> None:
    """On the host, before any worker reads it: the file holds a Qwen2.5-VL text model (a GGUF: of architecture
    qwen2vl)."""
    from .gguf.reader import GGUFFile
    from .tensor_files import SafetensorsFile

    if str(path).lower().endswith(".gguf"):
        qwen25_text_config(_gguf_shapes(GGUFFile(Path(path).expanduser())))
    else:
        qwen25_text_config({k: e.shape for k, e in SafetensorsFile(Path(path).expanduser()).entries.items()})
