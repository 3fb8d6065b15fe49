"""A GGUF diffusion-transformer file as ComfyUI-GGUF writes and reads it: which files are transformers and the
transformer's tensors (``source.py`` reads them under diffusers' names).

ComfyUI-GGUF's ``tools/convert.py`` stores a model's tensors under their ORIGINAL layout names (Black
Forest Labs' for Flux.1 / FLUX.2, Stability's for SD3, Wan's own, Qwen-Image's, which are diffusers'), in the
``general.architecture`` each family's ``GGUFFacts`` states; a ``model.diffusion_model.``
prefix is dropped. A 5-D patch embedding (e.g. Wan's) cannot pass llama.cpp's quantiser (4 dimensions at
most), so the converter leaves it out and ``tools/fix_5d_tensors.py`` appends it afterwards as a 5-D F32
tensor; a file without it was not fixed. Files without an architecture (stable-diffusion.cpp's) are
recognised from their tensor names, as ComfyUI-GGUF's compatibility mode does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import ConfigError
from .reader import GGUFFile

TRANSFORMER_PREFIX = "model.diffusion_model."
# ComfyUI-GGUF's image architectures (its IMG_ARCH_LIST) that no family here stated when this was written; one
# that a family's GGUFFacts states is read before this list is asked
OTHER_IMAGE_ARCHITECTURES = ("sd1", "sdxl", "aura", "cosmos", "ltxv", "hyvid", "lumina2")
TEXT_ARCHITECTURES = ("t5", "t5encoder", "llama", "qwen2vl", "qwen3", "qwen3vl")
UNNAMED_ARCHITECTURES = (None, "pig", "cow")  # stable-diffusion.cpp files and old ComfyUI-GGUF ones


def architecture_families() -> dict[str, tuple[str, ...]]:
    """general.architecture -> the ids of the families whose GGUF files carry it (each family's ``GGUFFacts``)."""
    from ..families.registry import FAMILIES

    out: dict[str, tuple[str, ...]] = {}
    for spec in FAMILIES:
        if spec.gguf is not None:
            out[spec.gguf.architecture] = (*out.get(spec.gguf.architecture, ()), spec.id)
    return out


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def allowed_families(file: GGUFFile) -> tuple[str, ...] | None:
    """The families ``file``'s ``general.architecture`` may hold (None: no architecture, decided by the names).
    A ConfigError naming the architecture and the tensor types for anything that is not a transformer we run."""
    from ..families.registry import labels

    arch = file.architecture
    known = architecture_families()
    if arch in known:
        return known[arch]
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
            f"dit-parallel runs the diffusion transformers of {labels('and')}",
            "load this file with ComfyUI-GGUF's Unet Loader (GGUF), or pick a GGUF of a supported family",
        )
    raise ConfigError(
        f"{name} is not a diffusion-transformer GGUF (general.architecture {arch!r}; {types})",
        "a language-model GGUF (llama.cpp's) or an unknown architecture has no diffusion transformer in it; "
        f"ComfyUI-GGUF's image files name {', '.join(sorted(known))}",
        f"pick a GGUF converted from a {labels()} transformer (ComfyUI-GGUF's tools)",
    )


def transformer_prefix(file: GGUFFile) -> str:
    return TRANSFORMER_PREFIX if any(k.startswith(TRANSFORMER_PREFIX) for k in file.tensors) else ""


def transformer_shapes(file: GGUFFile) -> dict[str, tuple[int, ...]]:
    """Every tensor of the transformer (prefix dropped) -> its torch shape, after the architecture check."""
    allowed_families(file)
    prefix = transformer_prefix(file)
    return {k[len(prefix) :]: t.shape for k, t in file.tensors.items() if k.startswith(prefix)}


def check_family(file: GGUFFile, family_id: str) -> None:
    """The tensor names' family must be one the file's architecture allows, and the file must hold the tensors
    the family's GGUF files always hold (``GGUFFacts.required``)."""
    from ..families.registry import family

    spec = family(family_id)
    if spec.gguf is None:
        raise ConfigError(
            f"{file.path.name} holds a {spec.label} transformer",
            f"ComfyUI-GGUF writes and reads no {spec.label} GGUF files, so neither does this loader",
            f"use the {spec.label} model's .safetensors file or its diffusers folder",
        )
    allowed = allowed_families(file)
    if allowed is not None and family_id not in allowed:
        raise ConfigError(
            f"{file.path.name} says general.architecture {file.architecture!r} but its tensors are a {family_id} model's",
            "a file's architecture and its tensor names must agree",
            "re-convert the file with ComfyUI-GGUF's tools/convert.py",
        )
    shapes = transformer_shapes(file)
    for tensor, fix in spec.gguf.required.items():
        if tensor not in shapes:
            raise ConfigError(
                f"{file.path.name} has no {tensor}",
                f"every {spec.label} GGUF written by ComfyUI-GGUF's tools holds it",
                fix,
            )


def describe_storage(source) -> str:
    """What the loader's reason says about a GGUF source's weights, e.g. "GGUF Q4_K x228, Q6_K x38 blocks kept
    quantised"."""
    counts: dict[str, int] = {}
    for kind in source.ggml.values():
        if kind.packed or kind.name == "BF16":
            counts[kind.name] = counts.get(kind.name, 0) + 1
    listed = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"GGUF {listed} blocks kept quantised" if listed else "GGUF, unquantised"


def check_gguf_request(storage: str, dequant_dtype: str) -> None:
    """The load options that apply to a GGUF file: a known ``dequant_dtype``, and no fp8 storage."""
    from .dequant import arithmetic_dtype

    arithmetic_dtype(dequant_dtype, torch.float32)  # a ConfigError naming the modes for an unknown one
    if storage == "fp8_e4m3fn":
        raise ConfigError(
            "a GGUF file was asked to be stored in fp8",
            "a GGUF file's weights are already quantised; they are kept in their GGML blocks",
            'use weights "as file" (or "convert to dtype" to dequantise them once, at load)',
        )
