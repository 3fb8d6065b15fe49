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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .t5_encoder import T5TextEncoder
from .t5_layout import t5_sizes
from .weights import TensorSource, load_tensors, parameters_on_meta


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
