"""A T5 / UMT5 text encoder read from ONE file, as ComfyUI keeps them in ``models/text_encoders``
(``t5xxl_fp16.safetensors``, ``umt5_xxl_fp16.safetensors``, ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``).

The files hold the encoder under the original checkpoints' names (``shared.weight``, ``encoder.block.N...``,
``encoder.final_layer_norm.weight``); the sizes come from the header, so any width loads. fp8 files keep
their Linear layers in fp8 (``fp8.Fp8Linear``), "fp8 scaled" ones with their per-layer scales, as ComfyUI
holds them. Tensors that are not the encoder's (a tokenizer stored in the file, the fp8 marker) are left to
the family that reads them. Families combine this with their tokenizer and prompt rules (``families/<f>/``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .t5_encoder import T5Sizes, T5TextEncoder
from .weights import TensorSource, load_tensors, parameters_on_meta

ANCHOR = "encoder.block.0.layer.0.SelfAttention.q.weight"


def t5_sizes(shapes: Mapping[str, tuple[int, ...]], name: str, what: str = "T5") -> T5Sizes:
    """The encoder's sizes from a file's tensor shapes (original key layout); a ConfigError when the file
    does not hold a T5 v1.1 / UMT5 encoder (``name``: the file, ``what``: the encoder the caller expects)."""
    needed = ["shared.weight", ANCHOR, "encoder.final_layer_norm.weight"]
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise ConfigError(
            f"{name} does not hold a {what} text encoder (no {missing[0]})",
            f"a {what} encoder file stores shared.weight and encoder.block.N.layer... tensors (the original "
            "checkpoints' layout, as ComfyUI's CLIPLoader reads it)",
            f"pick the {what} encoder file (e.g. umt5_xxl_fp16.safetensors / t5xxl_fp16.safetensors)",
        )
    if _ff(0, "wi_0") not in shapes and _ff(0, "wi") in shapes:
        raise ConfigError(
            f"{name} is an original T5 (v1.0) encoder with a single ReLU feed-forward",
            "only the gated-GELU T5 v1.1 / UMT5 encoders (T5-XXL, UMT5-XXL) are read",
            "use t5xxl_fp16.safetensors / umt5_xxl_*.safetensors",
        )
    vocab, width = shapes["shared.weight"]
    table = _attn(0, "relative_attention_bias")
    if table not in shapes:
        raise ConfigError(
            f"{name} has no {table}",
            "the first block of a T5 encoder holds its relative-position table",
            "use the complete encoder file",
        )
    buckets, heads = shapes[table]
    blocks = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.block\.(\d+)\.", k)))
    return T5Sizes(
        vocab=vocab,
        width=width,
        inner=shapes[ANCHOR][0],
        heads=heads,
        ff=shapes[_ff(0, "wi_0")][0],
        blocks=blocks,
        buckets=buckets,
        bias_per_block=_attn(1, "relative_attention_bias") in shapes,
    )


def _attn(block: int, part: str) -> str:
    return f"encoder.block.{block}.layer.0.SelfAttention.{part}.weight"


def _ff(block: int, part: str) -> str:
    return f"encoder.block.{block}.layer.1.DenseReluDense.{part}.weight"


def safetensors_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Name -> shape of a .safetensors file (header only)."""
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    return {k: e.shape for k, e in file.entries.items()}


def load_t5_safetensors(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    what: str = "T5",
) -> nn.Module:
    """The T5 / UMT5 encoder of a .safetensors file (see the module doc), on ``device``, weights in ``dtype``
    (fp8 ones as stored, with their scales)."""
    from .fp8 import detect_quantisation
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    with file:
        quant = detect_quantisation(file.header, file.read)
        scale_of = {w: file.read(s).to(torch.float32).reshape(()) for w, s in quant.scales.items()}
    shapes = {k: e.shape for k, e in file.entries.items()}
    with parameters_on_meta():
        model = T5TextEncoder(t5_sizes(shapes, file.path.name, what))
    params = {n for n, _ in model.named_parameters()}
    names = {k: k for k in shapes if k in params and k not in quant.extra_keys}

    def read(wanted: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in wanted:
                yield name, quant.stored(names[name], file.read(names[name]))

    source = TensorSource(
        file.path.name,
        {n: int(torch.Size(shapes[k]).numel()) for n, k in names.items()},
        read,
        fp8={n: quant.fp8_weights[k] for n, k in names.items() if k in quant.fp8_weights},
        scales={n: scale_of[k] for n, k in names.items() if k in scale_of},
        owned=True,
        shapes={n: tuple(shapes[k]) for n, k in names.items()},
        round_linear_to=quant.layer_dtype,
    )
    load_tensors(model, source, lambda name: "all", device, dtype, what=f"of the {what} encoder", storage=storage)
    return model.eval().requires_grad_(False)


def load_t5_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
    what: str = "T5",
) -> nn.Module:
    """The T5 / UMT5 encoder of ``path`` (.safetensors; ``overrides`` is unused: the file shows every size)."""
    if str(path).lower().endswith(".gguf"):
        from .gguf.t5_file import load_t5_gguf

        return load_t5_gguf(Path(path).expanduser(), device, dtype, storage, what)
    return load_t5_safetensors(path, device, dtype, storage, what)
