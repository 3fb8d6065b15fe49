"""Text encoders in GGUF files (llama.cpp's layout), as ComfyUI-GGUF's CLIP loaders read them from
``models/text_encoders`` / ``models/clip``.

llama.cpp names a model's tensors its own way (``blk.0.attn_q.weight``, ``token_embd.weight``,
``enc.blk.0.ffn_gate.weight``); the ``gguf`` package's tensor map gives the llama.cpp name of each Hugging Face
name for an architecture, which is how a file's tensors are found here (no name table of our own). Linear
weights stay in their GGML blocks (``GGUFLinear``); the token embedding is dequantised once, at load, in the
default arithmetic (float16 products), as ComfyUI-GGUF does with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError
from .reader import GGUFFile

ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {"qwen2vl": "QWEN2VL", "qwen3": "QWEN3", "t5": "T5", "t5encoder": "T5ENCODER", "llama": "LLAMA"}
)  # general.architecture -> gguf.MODEL_ARCH member


def check_text_architecture(file: GGUFFile, expected: tuple[str, ...], what: str) -> str:
    """``file``'s architecture when it is one of ``expected``; a ConfigError naming it and its types otherwise."""
    arch = file.architecture
    if arch not in expected:
        raise ConfigError(
            f"{file.path.name} is a {arch!r} GGUF (general.architecture; {file.describe_types()}), not {what}",
            f"this encoder is read from GGUF files of architecture {' or '.join(map(repr, expected))}",
            f"pick {what} in GGUF form (ComfyUI-GGUF's CLIPLoaderGGUF reads the same files), or its .safetensors",
        )
    return arch


def block_count(file: GGUFFile) -> int:
    """Blocks of the file (``blk.N.`` / ``enc.blk.N.``: highest index + 1)."""
    found = [int(m.group(1)) for k in file.tensors if (m := re.match(r"(?:enc\.|dec\.)?blk\.(\d+)\.", k))]
    return max(found) + 1 if found else 0


def llama_cpp_names(file: GGUFFile, hf_names: Iterable[str]) -> dict[str, str]:
    """Hugging Face name -> the file's tensor name, for those of ``hf_names`` the file holds."""
    import gguf

    arch = getattr(gguf.MODEL_ARCH, ARCHITECTURES[file.architecture])
    table = gguf.get_tensor_name_map(arch, block_count(file))
    out = {}
    for name in hf_names:
        found = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if found is not None and found in file.tensors:
            out[name] = found
    return out


def text_source_fields(file: GGUFFile, names: Mapping[str, str], dequant_dtype: str = "default") -> dict[str, Any]:
    """The fields of a ``weights.TensorSource`` reading ``names`` (model name -> the file's tensor name)."""
    missing = sorted(n for n, k in names.items() if k not in file.tensors)
    if missing:
        raise ConfigError(
            f"{file.path.name} has no tensor for {missing[0]} (and {len(missing) - 1} more)",
            "the encoder's config asks for tensors the file does not hold",
            "use the complete GGUF file of this encoder",
        )

    def read(wanted: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in wanted:
                entry = file.tensors[names[name]]
                data = file.read(names[name])
                yield name, data if entry.kind.packed else data.reshape(entry.shape)

    shapes = {n: file.tensors[k].shape for n, k in names.items()}
    return {
        "description": file.path.name,
        "numels": {n: int(torch.Size(s).numel()) for n, s in shapes.items()},
        "read": read,
        "owned": True,
        "shapes": shapes,
        "ggml": MappingProxyType({n: file.tensors[k].kind for n, k in names.items()}),
        "dequant_dtype": dequant_dtype,
    }


def probe_shapes(file: GGUFFile, prefix: str, probe: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of the ``probe`` tensors (Hugging Face names under ``prefix``) the file holds, and one
    ``{prefix}layers.N.`` entry a block (what a config read from a header counts layers by)."""
    known = llama_cpp_names(file, [prefix + n for n in probe])
    shapes = {name: file.tensors[k].shape for name, k in known.items()}
    shapes.update({f"{prefix}layers.{i}.": () for i in range(block_count(file))})
    return shapes


def load_llama_cpp_model(
    model: nn.Module,
    file: GGUFFile,
    prefix: str,
    device: str | torch.device,
    dtype: torch.dtype,
    storage: str,
    source_fields: Callable[[GGUFFile, Mapping[str, str]], dict[str, Any]] = text_source_fields,
) -> nn.Module:
    """``model`` (built on the meta device) filled with the file's tensors, found by its parameters' names under
    ``prefix``; ``source_fields`` makes the ``TensorSource`` (by default ``text_source_fields``)."""
    from ..weights import TensorSource, load_tensors

    wanted = [n for n, _ in model.named_parameters()]
    mapping = llama_cpp_names(file, [prefix + n for n in wanted])
    names = {n: mapping.get(prefix + n, f"(no tensor for {n})") for n in wanted}
    source = TensorSource(**source_fields(file, names))
    load_tensors(model, source, lambda name: "all", device, dtype, what="of the text model", storage=storage)
    return model.eval().requires_grad_(False)
