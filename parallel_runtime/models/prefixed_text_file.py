"""A transformers model read from the tensors of ONE ComfyUI file that stand under a name prefix (``model.``,
``visual.``): the text encoders ComfyUI keeps in ``models/text_encoders`` hold Hugging Face's names below such
a prefix, next to other parts (a vision tower, a tokenizer) that are read separately or not at all.

The model is built on the meta device from the file's header (the family's ``build`` turns the header's shapes
into a model), then filled from the file: fp8 files keep their Linear layers in fp8 (``fp8.Fp8Linear``) with
their per-layer scales, as ComfyUI holds them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .weights import TensorSource, load_tensors, parameters_on_meta

Shapes = Mapping[str, tuple[int, ...]]


def load_prefixed_model(
    path: str | os.PathLike,
    prefix: str,
    build: Callable[[Shapes], nn.Module],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    *,
    what: str = "of the text model",
    only_model_parameters: bool = False,
    comfy_fp8_layers: bool = True,
) -> nn.Module:
    """``build(shapes)`` (called on the meta device with the file's name -> shape) filled with the tensors of
    the .safetensors ``path`` under ``prefix`` (the prefix taken off), on ``device``, in eval mode.

    ``only_model_parameters``: read only the tensors the model has (the file may hold more under the prefix).
    ``comfy_fp8_layers``: as ComfyUI's scaled-fp8 models, round every Linear to the file's layer dtype and scaled
    weights stored wider to fp8."""
    from .fp8 import detect_quantisation
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    with file:
        quant = detect_quantisation(file.header, file.read)
        scale_of = {w: file.read(s).to(torch.float32).reshape(()) for w, s in quant.scales.items()}
    shapes = {k: e.shape for k, e in file.entries.items()}
    with parameters_on_meta():
        model = build(shapes)
    names = {k[len(prefix) :]: k for k in shapes if k.startswith(prefix) and k not in quant.extra_keys}
    if only_model_parameters:
        wanted = {n for n, _ in model.named_parameters()}
        names = {n: k for n, k in names.items() if n in wanted}

    def read(chosen: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in chosen:
                tensor = file.read(names[name])
                yield name, quant.stored(names[name], tensor) if comfy_fp8_layers else tensor

    source = TensorSource(
        file.path.name,
        {n: math.prod(shapes[k]) for n, k in names.items()},
        read,
        fp8={n: quant.fp8_weights[k] for n, k in names.items() if k in quant.fp8_weights},
        scales={n: scale_of[k] for n, k in names.items() if k in scale_of},
        owned=True,
        shapes={n: tuple(shapes[k]) for n, k in names.items()},
        round_linear_to=quant.layer_dtype if comfy_fp8_layers else None,
    )
    load_tensors(model, source, lambda name: "all", device, dtype, what=what, storage=storage)
    return model.eval().requires_grad_(False)


def decoder_config(shapes: Shapes, prefix: str, head_dim: int, layers: int, base: Mapping[str, Any]) -> dict[str, Any]:
    """The sizes of a transformers decoder-only text model (Hugging Face's names under ``prefix``) read from a
    header's ``shapes``, with ``head_dim`` and ``layers`` given and the rest (norm epsilon, context length,
    activation, RoPE base) from ``base``."""
    attention = prefix + "layers.0.self_attn.{}.weight"
    vocab, hidden = shapes[prefix + "embed_tokens.weight"]
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": shapes[prefix + "layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": layers,
        "num_attention_heads": shapes[attention.format("q_proj")][0] // head_dim,
        "num_key_value_heads": shapes[attention.format("k_proj")][0] // head_dim,
        "head_dim": head_dim,
        "rms_norm_eps": base["rms_norm_eps"],
        "max_position_embeddings": base["max_position_embeddings"],
        "hidden_act": base["hidden_act"],
        "rope_parameters": {"rope_type": "default", "rope_theta": base["rope_theta"]},
    }
