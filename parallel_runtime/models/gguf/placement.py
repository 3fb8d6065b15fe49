"""Where the tensors of a GGUF source go when a model loads (``weights.load_tensors``).

- The weight of every plain nn.Linear stays as stored: the Linear becomes a :class:`~.linear.GGUFLinear`
  holding the GGML blocks (or the F32 / F16 / BF16 values) on the device, dequantised per call. Layers
  the model's class keeps in float32 (``_keep_in_fp32_modules``: Wan's time embedder) are the exception:
  diffusers reads their dtype from their weight, so they are dequantised at load like any other tensor.
- A GGUFLinear's bias is kept as stored (F32 / F16; a BF16 one in float32) and cast per call, as ComfyUI-GGUF
  keeps it.
- Every other tensor (norms, modulation tables, convolutions, embeddings) is dequantised at load, with the
  same arithmetic (``dequant_dtype``), and then held in the compute dtype like a safetensors file's.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from .dequant import dequantise
from .linear import GGUFLinear, swap_to_gguf


def kept_weights(model: nn.Module, source, names: Collection[str], in_fp32: Collection[str]) -> set[str]:
    """Those of ``names`` that a GGUFLinear holds as stored: the weights of plain Linear layers (or of layers
    already swapped) that ``source`` holds in GGUF storage, outside the modules kept in float32."""
    out = set()
    for name in names:
        owner, _, leaf = name.rpartition(".")
        if leaf != "weight" or not owner or name not in source.ggml or name in in_fp32:
            continue
        if type(model.get_submodule(owner)) in (nn.Linear, GGUFLinear):
            out.add(name)
    return out


def prepare(model: nn.Module, source, chosen: Collection[str], in_fp32: Collection[str]) -> set[str]:
    """Swap the Linear layers whose weights ``source`` holds in GGUF storage (of the ``chosen`` names) to
    GGUFLinear (model on "meta"). Returns the weight names those layers hold as stored."""
    if not getattr(source, "ggml", None):
        return set()
    kept = kept_weights(model, source, chosen, in_fp32)
    swap_to_gguf(model, sorted(kept))
    return kept


def held_bytes(model: nn.Module, source, itemsize: int, in_fp32: Collection[str]) -> dict[str, int]:
    """Bytes each parameter of ``model`` takes once loaded from the GGUF ``source``: GGML blocks (or the stored
    floats) for a GGUFLinear's weight, its bias as stored (F16: 2, else float32), float32 for the modules kept
    in it, ``itemsize`` (the compute dtype's) for the rest."""
    params = dict(model.named_parameters())
    kept = kept_weights(model, source, list(params), in_fp32)
    out = {}
    for name, p in params.items():
        owner, _, leaf = name.rpartition(".")
        if name in kept:
            out[name] = source.ggml[name].tensor_bytes(tuple(source.shapes[name]))
        elif leaf == "bias" and f"{owner}.weight" in kept and name in source.ggml:
            out[name] = p.numel() * (2 if source.ggml[name].name == "F16" else 4)
        else:
            out[name] = p.numel() * (4 if name in in_fp32 else itemsize)
    return out


def place(
    model: nn.Module,
    name: str,
    data: torch.Tensor,
    source,
    kept: Collection[str],
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor | None, int]:
    """Put the GGUF tensor ``name`` (as read) in place. Returns (None, bytes held) when it went into a
    GGUFLinear, else (the dequantised float tensor for the ordinary path, 0)."""
    kind = source.ggml[name]
    owner, _, leaf = name.rpartition(".")
    if name in kept:
        layer = model.get_submodule(owner)
        stored = data.to(device, copy=data.device == device and not source.owned)
        layer.set_stored(stored, kind, source.dequant_dtype)
        return None, stored.numel() * stored.element_size()
    if leaf == "bias" and f"{owner}.weight" in kept:
        kept_dtype = data.dtype in (torch.float32, torch.float16)
        bias = data if kept_dtype else dequantise(data, kind, tuple(source.shapes[name]), torch.float32)
        layer = model.get_submodule(owner)
        layer.bias = nn.Parameter(bias.reshape(-1).to(device, copy=not source.owned), requires_grad=False)
        return None, layer.bias.numel() * layer.bias.element_size()
    return dequantise(data, kind, tuple(source.shapes[name]), dtype, source.dequant_dtype), 0
