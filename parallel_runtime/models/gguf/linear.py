"""An nn.Linear whose weight stays as a GGUF file stores it, dequantised each time the layer runs.

:class:`GGUFLinear` holds its weight in the file's type: GGML blocks (a uint8 ``[out, bytes per row]``
tensor) for the quantised types, the stored float tensor for F32 / F16 / BF16. Each call dequantises the
weight in the input's dtype (:func:`~.dequant.dequantise` with the layer's ``dequant_dtype`` mode) right
before the matrix product, so the full-precision weight exists only during that call; the bias is kept
as stored (F32 / F16) and cast per call, as ComfyUI-GGUF does.

LoRA follows ComfyUI-GGUF + ComfyUI's LoRA loaders (its ``GGUFModelPatcher``):

- quantised and BF16 weights are never rewritten: the patches are kept on the layer and applied to the
  dequantised weight in the compute dtype at every call (:meth:`GGUFLinear.set_patches`), or, for a patch
  that needs a whole fused tensor the layer holds only rows of, given as a ready patched weight
  (:meth:`GGUFLinear.set_patched`);
- F32 / F16 weights are patched once in float32 and stored back in their own dtype (:meth:`requantise_`),
  the loaded values kept for :meth:`restore`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .dequant import DEQUANT_MODES, dequantise
from .formats import BF16, F32, GGMLType

LayerPatch = Callable[[torch.Tensor], None]  # changes the dequantised weight in place


class GGUFLinear(nn.Linear):
    """An nn.Linear computing with a weight dequantised per call from its GGUF storage."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias, device="meta")
        self.kind: GGMLType = F32
        self.dequant_dtype = "default"
        self.patches: tuple[LayerPatch, ...] = ()
        self.patched: torch.Tensor | None = None
        self.original: torch.Tensor | None = None  # an F32 / F16 weight before requantise_, for restore()

    @classmethod
    def like(cls, linear: nn.Linear) -> GGUFLinear:
        """An empty (meta) GGUFLinear with ``linear``'s sizes."""
        return cls(linear.in_features, linear.out_features, bias=linear.bias is not None)

    @property
    def logical_shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def set_stored(self, data: torch.Tensor, kind: GGMLType, dequant_dtype: str = "default") -> None:
        """Hold ``data`` (the file's bytes or float values of the weight, already on the layer's device)."""
        if dequant_dtype not in DEQUANT_MODES:
            raise ValueError(f"dequant_dtype {dequant_dtype!r} is not one of {DEQUANT_MODES}")
        self.weight = nn.Parameter(data, requires_grad=False)
        self.kind, self.dequant_dtype = kind, dequant_dtype

    @property
    def patched_per_call(self) -> bool:
        """Whether LoRA patches are applied at each call (quantised / BF16) rather than stored (F32 / F16)."""
        return self.kind.packed or self.kind is BF16

    def compute_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype``: dequantised, then patched (or the patched weight when one is set)."""
        if self.patched is not None:
            return self.patched.to(dtype)
        weight = dequantise(self.weight, self.kind, self.logical_shape, dtype, self.dequant_dtype)
        if self.patches:
            if weight.data_ptr() == self.weight.data_ptr():
                weight = weight.clone()  # the stored tensor itself (a cast to its own dtype): never patch it
            for patch in self.patches:
                patch(weight)
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.compute_weight(x.dtype), bias)

    # -- LoRA --------------------------------------------------------------------------------------
    def set_patches(self, patches: Sequence[LayerPatch]) -> None:
        """Apply ``patches`` (in order) to the dequantised weight at every call, until :meth:`restore`."""
        self.patches, self.patched = tuple(patches), None

    def set_patched(self, weight: torch.Tensor) -> None:
        """Use ``weight`` (compute dtype, already patched) instead of dequantising, until :meth:`restore`."""
        self.patched, self.patches = weight.detach(), ()

    def dequantised(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The loaded weight (no patch) in ``dtype``, with the layer's dequantisation arithmetic."""
        stored = self.original if self.original is not None else self.weight
        return dequantise(stored, self.kind, self.logical_shape, dtype, self.dequant_dtype)

    def requantise_(self, weight: torch.Tensor, round_fn: Any = None) -> None:
        """Store ``weight`` (float32) as the layer's F32 / F16 values, keeping the loaded ones for restore."""
        if self.patched_per_call:
            raise TypeError(f"a {self.kind.name} GGUF weight is patched per call, not rewritten")
        if self.original is None:
            self.original = self.weight.data
        self.weight = nn.Parameter(weight.to(self.original.dtype), requires_grad=False)

    def restore(self) -> None:
        """Back to the loaded weight and no patch."""
        self.patches, self.patched = (), None
        if self.original is not None:
            self.weight = nn.Parameter(self.original, requires_grad=False)
            self.original = None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, storage={self.kind.name}, dequant_dtype={self.dequant_dtype}"


def swap_to_gguf(model: nn.Module, weight_names: Iterable[str]) -> list[str]:
    """Replace the nn.Linear owning each ``<module>.weight`` in ``weight_names`` by an empty :class:`GGUFLinear`
    (on a model whose parameters are on "meta"). Returns the module names swapped."""
    swapped = []
    for name in weight_names:
        owner, _, leaf = name.rpartition(".")
        if leaf != "weight" or not owner or type(model.get_submodule(owner)) is not nn.Linear:
            continue
        parent_name, _, child = owner.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, GGUFLinear.like(model.get_submodule(owner)))
        swapped.append(owner)
    return swapped


def gguf_layers(model: nn.Module) -> dict[str, GGUFLinear]:
    """Every GGUFLinear of ``model`` by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, GGUFLinear)}


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter as the model uses it (a GGUF weight's logical shape, not its blocks')."""
    layers = gguf_layers(model)
    out = {}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner)
        out[name] = layer.logical_shape if layer is not None and leaf == "weight" else tuple(p.shape)
    return out
