"""LoRA on GGUF weights that stay quantised (``models.gguf.linear.GGUFLinear`` of a packed or BF16 type).

ComfyUI-GGUF never rewrites such a weight: the patches ride on the tensor and are applied to the weight
dequantised in the compute dtype each time the layer runs (its ``GGMLLayer.get_weight`` with ComfyUI's
``calculate_weight``). The same here: each layer of a patched group gets its patches as callables applied
per call (:func:`patch_group`), with ComfyUI's arithmetic for a weight in the compute dtype
(``patch_math.apply_patch_cast``); swapping a LoRA or a strength only replaces those callables.

A group is one tensor of the original layout, which the loaded model may hold as several layers (a fused
q/k/v as ``to_q``, ``to_k``, ``to_v``) or with its rows reordered. Patches whose rows depend only on the
same rows (plain LoRA, diff, set), and any patch aimed at one layer's own rows, act on each layer alone.
Anything else (DoRA, LoHa, LoKr on a whole fused tensor) needs the whole tensor: it is dequantised,
gathered in the original row order, patched once and each layer is given its patched rows
(``GGUFLinear.set_patched``, a compute-dtype copy of those layers while the patch is on).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..gguf.linear import GGUFLinear
from .patch_math import apply_patch_cast, row_separable
from .routing import Piece, Route

TensorsOf = Callable[[Any, torch.device], dict[str, torch.Tensor]]  # (use, device) -> its fp32 tensors by role


def deferred_layers(route: Route, layer_of: Callable[[str], Any]) -> dict[str, GGUFLinear] | None:
    """The route's layers when every one of them is a GGUFLinear patched per call, else None."""
    layers = {piece.param: layer_of(piece.param) for piece in route.pieces}
    if all(isinstance(layer, GGUFLinear) and layer.patched_per_call for layer in layers.values()):
        return layers
    return None


def _whole_rows(route: Route, piece: Piece) -> bool:
    return len(route.pieces) == 1 and piece.segments == ((0, route.rows),)


def _per_layer(route: Route, piece: Piece, use: Any) -> bool:
    """Whether ``use`` can act on ``piece``'s layer alone."""
    return use.selector == piece.param or _whole_rows(route, piece) or row_separable(use.patch.patch)


def patch_group(
    route: Route, layers: Mapping[str, GGUFLinear], uses: Sequence[Any], tensors_of: TensorsOf, dtype: torch.dtype
) -> None:
    """Give every layer of ``route`` the patches ``uses`` (in stack order) asks for; ``dtype``: the compute
    dtype (for a group that has to be patched whole)."""
    if all(_per_layer(route, piece, use) for piece in route.pieces for use in uses if _touches(use, piece)):
        for piece in route.pieces:
            layer = layers[piece.param]
            device = layer.weight.device
            calls = [_call(route, piece, use, tensors_of(use, device)) for use in uses if _touches(use, piece)]
            layer.set_patches(calls)
        return
    _patch_whole(route, layers, uses, tensors_of, dtype)


def _touches(use: Any, piece: Piece) -> bool:
    return use.selector in (None, piece.param)


def _call(route: Route, piece: Piece, use: Any, tensors: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], None]:
    """The per-call patch of ``use`` on ``piece``'s layer (its rows of a whole-tensor patch picked once)."""
    patch = use.patch.patch
    if use.selector is None and not _whole_rows(route, piece):
        role = "up" if patch.kind == "lora" else "diff"
        index = piece.index().to(tensors[role].device)
        tensors = {**tensors, role: tensors[role].index_select(0, index)}
    return functools.partial(_apply, patch=patch, tensors=tensors, scale=use.patch.scale, strength=use.strength)


def _apply(weight: torch.Tensor, patch: Any, tensors: dict[str, torch.Tensor], scale: float, strength: float) -> None:
    apply_patch_cast(weight, patch, tensors, scale, strength)


def _patch_whole(
    route: Route, layers: Mapping[str, GGUFLinear], uses: Sequence[Any], tensors_of: TensorsOf, dtype: torch.dtype
) -> None:
    first = layers[route.pieces[0].param]
    device = first.weight.device
    fused = torch.empty((route.rows, first.in_features), dtype=dtype, device=device)
    for piece in route.pieces:
        fused[piece.index().to(device)] = layers[piece.param].dequantised(dtype)
    for use in uses:
        tensors = tensors_of(use, device)
        if use.selector is None:
            apply_patch_cast(fused, use.patch.patch, tensors, use.patch.scale, use.strength)
            continue
        index = route.piece(use.selector).index().to(device)
        rows = fused.index_select(0, index)
        apply_patch_cast(rows, use.patch.patch, tensors, use.patch.scale, use.strength)
        fused[index] = rows
    for piece in route.pieces:
        layers[piece.param].set_patched(fused.index_select(0, piece.index().to(device)))
