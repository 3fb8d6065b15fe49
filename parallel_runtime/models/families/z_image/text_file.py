"""Z-Image's text encoder from ONE file, as ComfyUI keeps it in ``models/text_encoders``.

Qwen3-4B (``qwen_3_4b.safetensors``, Comfy-Org's repackaging): Hugging Face's Qwen3 names under ``model.``
(``model.layers.N.self_attn.q_proj.weight``, ``...q_norm.weight``, ``model.embed_tokens.weight``,
``model.norm.weight``), no LM head. transformers' ``Qwen3Model`` is built with the sizes of the header (the head
width from ``q_norm``) and the rest of Qwen3-4B's config. fp8 files keep their Linear layers in fp8 as
transformers does (``fp8.Fp8Linear``). The tokenizer is a folder: ComfyUI's own ``qwen25_tokenizer`` serves (Qwen3
shares Qwen2.5's vocabulary, and the chat-template tokens Z-Image uses are in both), or a diffusers one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...weights import TensorSource, load_tensors, parameters_on_meta
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
    vocab, hidden = shapes[TEXT_PREFIX + "embed_tokens.weight"]
    head_dim = shapes[key.format("q_norm")][0]
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": shapes[TEXT_PREFIX + "layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")}),
        "num_attention_heads": shapes[key.format("q_proj")][0] // head_dim,
        "num_key_value_heads": shapes[key.format("k_proj")][0] // head_dim,
        "head_dim": head_dim,
        "rms_norm_eps": base["rms_norm_eps"],
        "max_position_embeddings": base["max_position_embeddings"],
        "hidden_act": base["hidden_act"],
        "rope_parameters": {"rope_type": "default", "rope_theta": base["rope_theta"]},
    }


def load_qwen3_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The Qwen3 text model in ComfyUI's ``path`` (see the module doc), on ``device``."""
    from transformers import Qwen3Config, Qwen3Model

    from ...fp8 import detect_quantisation
    from ...tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    with file:
        quant = detect_quantisation(file.header, file.read)
        scale_of = {w: file.read(s).to(torch.float32).reshape(()) for w, s in quant.scales.items()}
    shapes = {k: e.shape for k, e in file.entries.items()}
    with parameters_on_meta():
        model = Qwen3Model(Qwen3Config(**qwen3_text_config(shapes, overrides)))
    names = {k[len(TEXT_PREFIX) :]: k for k in shapes if k.startswith(TEXT_PREFIX) and k not in quant.extra_keys}

    def read(wanted: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in wanted:
                yield name, file.read(names[name])

    source = TensorSource(
        file.path.name,
        {n: math.prod(shapes[k]) for n, k in names.items()},
        read,
        fp8={n: quant.fp8_weights[k] for n, k in names.items() if k in quant.fp8_weights},
        scales={n: scale_of[k] for n, k in names.items() if k in scale_of},
        owned=True,
        shapes={n: tuple(shapes[k]) for n, k in names.items()},
    )
    load_tensors(model, source, lambda name: "all", device, dtype, what="of the text model", storage=storage)
    return model.eval().requires_grad_(False)


ENCODER_FILE = TextEncoderFile("Qwen3", load_qwen3_text_file, encode_z_image, DEFAULT_LENGTH)
