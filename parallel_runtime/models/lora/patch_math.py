"""The arithmetic of one patch on one fp32 weight, with ComfyUI's formulas and operation order.

``apply_patch`` changes ``weight`` (fp32, possibly a view of rows of a fused tensor) in place:

- LoRA: ``W += (strength * alpha/rank) * (up @ down)`` (LoCon: the mid factor folded into down first);
- LoHa: ``W += (strength * alpha/rank) * ((w1a @ w1b) * (w2a @ w2b))`` (Tucker cores when present);
- LoKr: ``W += (strength * alpha/rank) * kron(w1, w2)`` (each factor full or a low-rank product);
- with a DoRA ``dora_scale``: the weight-decomposed update instead of the plain sum;
- diff: ``W += strength * diff``; set: ``W = set_weight``.

The scalar products are formed in Python floats in the same order as ComfyUI, so the rounding of
every element matches its ``calculate_weight``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .modules import Patch

Tensors = Mapping[str, torch.Tensor]


def apply_patch(weight: torch.Tensor, patch: Patch, tensors: Tensors, scale: float, strength: float) -> None:
    """Add ``patch`` (its tensors by role, fp32 on the weight's device) at ``strength`` to ``weight``."""
    if patch.kind == "set":
        weight.copy_(tensors["diff"])
        return
    if patch.kind == "diff":
        if strength != 0.0:
            weight += strength * tensors["diff"]
        return
    if patch.kind == "lora" and "mid" not in tensors and "dora_scale" not in tensors:
        # W += (strength * scale) * (up @ down) in one pass over W (BLAS: the product, scaled, added)
        rows = weight.view(weight.shape[0], -1)
        rows.addmm_(tensors["up"].flatten(start_dim=1), tensors["down"].flatten(start_dim=1), alpha=strength * scale)
        return
    delta = _delta(patch.kind, tensors).reshape(weight.shape)
    if "dora_scale" in tensors:
        _dora(weight, delta, tensors["dora_scale"], scale, strength)
    else:
        weight += (strength * scale) * delta


def row_separable(patch: Patch) -> bool:
    """Whether rows of the patched weight depend only on the same rows of the patch (plain LoRA, diff,
    set), so a fused tensor's pieces can be patched one by one, in place."""
    return patch.kind in ("diff", "set") or (patch.kind == "lora" and not {"mid", "dora_scale"} & set(patch.keys))


def apply_patch_rows(
    weight: torch.Tensor, patch: Patch, tensors: Tensors, scale: float, strength: float, rows: slice | torch.Tensor
) -> None:
    """:func:`apply_patch` of the ``rows`` of a row-separable patch to ``weight`` (those rows' weight)."""
    role = "up" if patch.kind == "lora" else "diff"
    picked = tensors[role][rows] if isinstance(rows, slice) else tensors[role].index_select(0, rows)
    apply_patch(weight, patch, {**tensors, role: picked}, scale, strength)


def _delta(kind: str, t: Tensors) -> torch.Tensor:
    if kind == "lora":
        up, down = t["up"], t["down"]
        if "mid" in t:  # LoCon: fold the [rank, rank, k, k] mid into down
            mid = t["mid"]
            shape = [down.shape[1], down.shape[0], mid.shape[2], mid.shape[3]]
            down = torch.mm(down.transpose(0, 1).flatten(start_dim=1), mid.transpose(0, 1).flatten(start_dim=1))
            down = down.reshape(shape).transpose(0, 1)
        return torch.mm(up.flatten(start_dim=1), down.flatten(start_dim=1))
    if kind == "loha":
        if "hada_t1" in t:
            m1 = _tucker(t["hada_t1"], t["hada_w1_b"], t["hada_w1_a"])
            m2 = _tucker(t["hada_t2"], t["hada_w2_b"], t["hada_w2_a"])
        else:
            m1 = torch.mm(t["hada_w1_a"], t["hada_w1_b"])
            m2 = torch.mm(t["hada_w2_a"], t["hada_w2_b"])
        return m1 * m2
    if kind == "lokr":
        w1 = t["lokr_w1"] if "lokr_w1" in t else torch.mm(t["lokr_w1_a"], t["lokr_w1_b"])
        if "lokr_w2" in t:
            w2 = t["lokr_w2"]
        elif "lokr_t2" in t:
            w2 = _tucker(t["lokr_t2"], t["lokr_w2_b"], t["lokr_w2_a"])
        else:
            w2 = torch.mm(t["lokr_w2_a"], t["lokr_w2_b"])
        if w2.dim() == 4:
            w1 = w1.unsqueeze(2).unsqueeze(2)
        return torch.kron(w1, w2)
    raise ValueError(f"unknown patch kind {kind!r}")


def _tucker(core: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A Tucker-factored weight: core [i, j, k, l] with b [j, r] and a [i, p] -> [p, r, k, l]."""
    return torch.einsum("i j k l, j r, i p -> p r k l", core, b, a)


def _dora(weight: torch.Tensor, delta: torch.Tensor, magnitude: torch.Tensor, scale: float, strength: float) -> None:
    """DoRA: the direction W + scale * delta renormalised to ``magnitude`` (per output row when the
    magnitude has one value per row, else per input column), blended in by ``strength``. As in
    ComfyUI, the per-row norm is taken of the weight before the update, the per-column one after; the
    fp32 update and factor are cast to the weight's dtype (a no-op for an fp32 weight)."""
    delta *= scale
    updated = weight + delta.to(weight.dtype)
    if magnitude.shape[0] == updated.shape[0]:
        norm = weight.reshape(weight.shape[0], -1).norm(dim=1, keepdim=True)
        norm = norm.reshape(weight.shape[0], *[1] * (weight.dim() - 1))
    else:
        columns = updated.transpose(0, 1).reshape(updated.shape[1], -1)
        norm = columns.norm(dim=1, keepdim=True).reshape(updated.shape[1], *[1] * (updated.dim() - 1))
        norm = norm.transpose(0, 1)
    norm = norm + torch.finfo(weight.dtype).eps
    updated *= (magnitude / norm).to(weight.dtype)
    if strength != 1.0:
        updated -= weight
        weight += strength * updated
    else:
        weight.copy_(updated)


def apply_patch_cast(weight: torch.Tensor, patch: Patch, tensors: Tensors, scale: float, strength: float) -> None:
    """:func:`apply_patch` on a weight held in its compute dtype (ComfyUI-GGUF patches the dequantised weight
    there): each update is formed in float32 from the fp32 ``tensors`` and added in the weight's dtype
    (``W += ((strength * scale) * delta).to(W.dtype)``; a diff is cast first, then scaled: ``W += strength *
    diff.to(W.dtype)``), DoRA's norms taken in the weight's dtype, as ComfyUI's ``calculate_weight`` does
    for a weight that is not float32. For a float32 weight the same operations in float32."""
    if patch.kind == "set":
        weight.copy_(tensors["diff"])
        return
    if patch.kind == "diff":
        if strength != 0.0:
            weight += strength * tensors["diff"].to(weight.dtype)
        return
    delta = _delta(patch.kind, tensors).reshape(weight.shape)
    if "dora_scale" not in tensors:
        weight += ((strength * scale) * delta).to(weight.dtype)
        return
    _dora(weight, delta, tensors["dora_scale"], scale, strength)
