"""A GGUF diffusion-transformer file as ComfyUI-GGUF writes and reads it: which files are transformers, the
transformer's tensors, and a :class:`~parallel_runtime.models.weights.TensorSource` over them.

ComfyUI-GGUF's ``tools/convert.py`` stores a model's tensors under their ORIGINAL layout names (Black
Forest Labs' for Flux.1 / FLUX.2, Stability's for SD3, Wan's own, Qwen-Image's, which are diffusers'), in
``general.architecture`` "flux" (also FLUX.2), "sd3", "wan" or "qwen_image"; a ``model.diffusion_model.``
prefix is dropped. Wan's 5-D ``patch_embedding.weight`` cannot pass llama.cpp's quantiser (4 dimensions at
most), so the converter leaves it out and ``tools/fix_5d_tensors.py`` appends it afterwards as a 5-D F32
tensor; a file without it was not fixed. Files without an architecture (stable-diffusion.cpp's) are
recognised from their tensor names, as ComfyUI-GGUF's compatibility mode does.

The tensors are converted to diffusers' names with the family's conversion plan (renames and row ranges
only), so a rank reads just the rows of the tensors it holds; quantised rows stay GGML blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

import torch

from ...errors import ConfigError
from .formats import GGMLType
from .reader import GGUFFile

TRANSFORMER_PREFIX = "model.diffusion_model."
# general.architecture -> the families a file of it may hold (ComfyUI-GGUF's image architectures we run)
ARCHITECTURE_FAMILIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"flux": ("flux", "flux2"), "sd3": ("sd3",), "wan": ("wan",), "qwen_image": ("qwen-image",)}
)
OTHER_IMAGE_ARCHITECTURES = ("sd1", "sdxl", "aura", "hidream", "cosmos", "ltxv", "hyvid", "lumina2")
TEXT_ARCHITECTURES = ("t5", "t5encoder", "llama", "qwen2vl", "qwen3", "qwen3vl")
UNNAMED_ARCHITECTURES = (None, "pig", "cow")  # stable-diffusion.cpp files and old ComfyUI-GGUF ones


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def allowed_families(file: GGUFFile) -> tuple[str, ...] | None:
    """The families ``file``'s ``general.architecture`` may hold (None: no architecture, decided by the names).
    A ConfigError naming the architecture and the tensor types for anything that is not a transformer we run."""
    arch = file.architecture
    if arch in ARCHITECTURE_FAMILIES:
        return ARCHITECTURE_FAMILIES[arch]
    if arch in UNNAMED_ARCHITECTURES:
        return None
    name, types = file.path.name, file.describe_types()
    if arch in TEXT_ARCHITECTURES:
        raise ConfigError(
            f"{name} is a text-encoder GGUF (general.architecture {arch!r}; {types}), not a diffusion transformer",
            "the Parallel Model Loader loads a diffusion transformer; text encoders are read by Parallel Text Encode",
            "pick the transformer's .gguf (models/unet or models/diffusion_models) here, and this file in "
            "Parallel Text Encode's text_encoder input (or ComfyUI-GGUF's CLIPLoaderGGUF)",
        )
    if arch in OTHER_IMAGE_ARCHITECTURES:
        raise ConfigError(
            f"{name} holds a {arch!r} model (general.architecture; {types})",
            "dit-parallel runs the diffusion transformers of Flux.1, FLUX.2, SD3, Qwen-Image and Wan 2.1/2.2",
            "load this file with ComfyUI-GGUF's Unet Loader (GGUF), or pick a GGUF of a supported family",
        )
    raise ConfigError(
        f"{name} is not a diffusion-transformer GGUF (general.architecture {arch!r}; {types})",
        "a language-model GGUF (llama.cpp's) or an unknown architecture has no diffusion transformer in it; "
        "ComfyUI-GGUF's image files name flux, sd3, wan or qwen_image",
        "pick a GGUF converted from a Flux.1, FLUX.2, SD3, Qwen-Image or Wan transformer (ComfyUI-GGUF's tools)",
    )


def transformer_prefix(file: GGUFFile) -> str:
    return TRANSFORMER_PREFIX if any(k.startswith(TRANSFORMER_PREFIX) for k in file.tensors) else ""


def transformer_shapes(file: GGUFFile) -> dict[str, tuple[int, ...]]:
    """Every tensor of the transformer (prefix dropped) -> its torch shape, after the architecture check."""
    allowed_families(file)
    prefix = transformer_prefix(file)
    return {k[len(prefix) :]: t.shape for k, t in file.tensors.items() if k.startswith(prefix)}


def check_family(file: GGUFFile, family: str) -> None:
    """The tensor names' family must be one the file's architecture allows; Wan needs its 5-D patch embedding."""
    allowed = allowed_families(file)
    if allowed is not None and family not in allowed:
        raise ConfigError(
            f"{file.path.name} says general.architecture {file.architecture!r} but its tensors are a {family} model's",
            "a file's architecture and its tensor names must agree",
            "re-convert the file with ComfyUI-GGUF's tools/convert.py",
        )
    if family == "wan" and "patch_embedding.weight" not in transformer_shapes(file):
        raise ConfigError(
            f"{file.path.name} has no patch_embedding.weight",
            "ComfyUI-GGUF's converter leaves out Wan's 5-D patch embedding and its tools/fix_5d_tensors.py adds it "
            "back after quantising; this file was not fixed",
            "run ComfyUI-GGUF's tools/fix_5d_tensors.py on the file, or use a published Wan GGUF",
        )


def gguf_source(info, convert, dequant_dtype: str = "default"):
    """The :class:`~..weights.TensorSource` of the single-file ``info`` (a .gguf): diffusers names read
    through the conversion plan of ``convert`` (original -> diffusers state dict), GGML blocks kept as stored."""
    from ..conversion_plan import PlanError, plan_conversion
    from ..weights import TensorSource

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
    return TensorSource(
        file.path.name,
        {name: math.prod(shape) for name, shape in out_shapes.items()},
        read,
        owned=True,
        shapes=out_shapes,
        ggml=MappingProxyType(kinds),
        dequant_dtype=dequant_dtype,
    )


def stored_bytes(source) -> dict[str, int]:
    """Bytes each tensor of a GGUF source takes as stored (GGML blocks; F32 / F16 / BF16 values)."""
    return {name: kind.tensor_bytes(source.shapes[name]) for name, kind in source.ggml.items()}
