"""A GGUF transformer file's tensors under diffusers' names: what a :class:`~..weights.TensorSource` over them
holds (a reader of only the rows a rank asks for, quantised rows kept as GGML blocks).

The tensors are converted with the family's conversion plan (``conversion_plan``: renames and row ranges only),
so a PipeFusion rank reads just the rows of the tensors it holds and nothing is dequantised on the way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import torch

from ...errors import ConfigError
from ..conversion_plan import PlanError, plan_conversion
from .formats import GGMLType
from .model_file import check_family
from .reader import GGUFFile


def gguf_source_fields(info, convert, dequant_dtype: str = "default") -> dict[str, Any]:
    """The fields of the :class:`~..weights.TensorSource` of the single-file ``info`` (a .gguf): diffusers names
    read through the conversion plan of ``convert`` (original -> diffusers state dict), GGML blocks kept as
    stored."""
    file = GGUFFile(info.path)
    check_family(file, info.family)
    prefix = info.prefix
    shapes = {k[len(prefix) :]: t.shape for k, t in file.tensors.items() if k.startswith(prefix)}
    try:
        plan = plan_conversion(convert, shapes)
    except PlanError as exc:
        raise ConfigError(
            f"{file.path.name}: the {info.family} layout cannot be converted to diffusers' without arithmetic ({exc})",
            "GGUF weights are kept in their GGML blocks, which can only be renamed and cut into rows",
            "use the model's .safetensors file",
        ) from None
    kinds: dict[str, GGMLType] = {}
    for name in plan.pieces:
        found = {file.tensors[prefix + k].kind for k in plan.sources(name)}
        if len(found) > 1:
            raise ConfigError(
                f"{file.path.name}: {name} is made of tensors stored as {', '.join(sorted(k.name for k in found))}",
                "a converted tensor is read as one GGML type",
                "use a GGUF file converted by ComfyUI-GGUF's tools (one type per fused tensor)",
            )
        kinds[name] = found.pop()

    def read(names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in names:
                whole = plan.trailing[name] is None  # a 0-d tensor
                parts = [file.read(prefix + p.key, None if whole else (p.r0, p.r1)) for p in plan.pieces[name]]
                data = parts[0] if len(parts) == 1 else torch.cat(parts)
                yield name, data if kinds[name].packed else data.reshape(plan.shape(name))

    out_shapes = {name: plan.shape(name) for name in plan.pieces}
    return {
        "description": file.path.name,
        "numels": {name: math.prod(shape) for name, shape in out_shapes.items()},
        "read": read,
        "owned": True,
        "shapes": out_shapes,
        "ggml": MappingProxyType(kinds),
        "dequant_dtype": dequant_dtype,
    }
