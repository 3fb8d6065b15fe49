"""An original-layout -> diffusers conversion as data: which rows of which file tensor make each model tensor.

The family converters (diffusers' own for Flux.1, FLUX.2, SD3; ours for PixArt; the identity for
Qwen-Image) rename tensors and cut or reorder them along their first dimension (fused q/k/v split into
three, a modulation's shift/scale halves swapped). Run once on *probe* tensors - one per file tensor,
of shape (rows, 1, ...), each row holding a unique integer (tensor number << 32 | row) - a converter
reveals, for every tensor it produces, the exact file rows it is made of. Loading then reads only those
rows, for only the tensors a rank needs (a PipeFusion stage: its blocks), and never builds the whole
converted state dict. A converter that does anything else (arithmetic, reshapes across dim 1) leaves
values that decode to nothing or rows of several tensors in one: :func:`plan_conversion` then raises
:class:`PlanError` and the caller converts eagerly instead. LoRA routing (``lora.routing``) is the same plan
inverted: original tensor -> the diffusers rows that hold it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

ID_SHIFT = 32
Converter = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class PlanError(RuntimeError):
    """The converter did more than renaming and row operations."""


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``r0:r1`` of file tensor ``key``."""

    key: str
    r0: int
    r1: int


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """diffusers name -> the file pieces it is made of (concatenated along dim 0), plus what was left over."""

    pieces: Mapping[str, tuple[Piece, ...]]
    trailing: Mapping[str, tuple[int, ...] | None]  # name -> shape after dim 0 (None: a 0-d tensor)
    unused: tuple[str, ...]  # file tensors the converter did not consume

    def shape(self, name: str) -> tuple[int, ...]:
        trailing = self.trailing[name]
        if trailing is None:
            return ()
        return (sum(p.r1 - p.r0 for p in self.pieces[name]), *trailing)

    def sources(self, name: str) -> tuple[str, ...]:
        """File tensors ``name`` reads from (in order, without repeats)."""
        return tuple(dict.fromkeys(p.key for p in self.pieces[name]))


def plan_conversion(convert: Converter, shapes: Mapping[str, tuple[int, ...]]) -> ConversionPlan:
    """Probe ``convert`` with row-id tensors shaped like ``shapes`` (file name -> shape); see the module doc."""
    keys = sorted(shapes)
    if len(keys) >= 1 << (63 - ID_SHIFT):
        raise PlanError("too many tensors to number")
    probes: dict[str, torch.Tensor] = {}
    for index, key in enumerate(keys):
        shape = tuple(shapes[key])
        rows = shape[0] if shape else 1
        ids = torch.arange(rows, dtype=torch.int64) + (index << ID_SHIFT)
        probes[key] = ids.reshape(shape[:1] + (1,) * (len(shape) - 1)) if shape else ids.reshape(())
    out = convert(dict(probes))
    pieces, trailing = {}, {}
    for name, tensor in out.items():
        if not isinstance(tensor, torch.Tensor):
            raise PlanError(f"{name}: converter produced {type(tensor).__name__}")
        if tensor.dtype != torch.int64 or tensor.device.type != "cpu":
            raise PlanError(f"{name}: converter changed the probe's dtype or device ({tensor.dtype}, {tensor.device})")
        if tensor.dim() > 1 and any(s != 1 for s in tensor.shape[1:]):
            raise PlanError(f"{name}: converter reshaped beyond dim 0 ({tuple(tensor.shape)})")
        flat = tensor.reshape(-1)
        source = flat >> ID_SHIFT
        row = flat - (source << ID_SHIFT)
        if flat.numel() == 0 or int(source.min()) < 0 or int(source.max()) >= len(keys):
            raise PlanError(f"{name}: values do not decode to file rows")
        pieces[name] = _runs(keys, source, row)
        if tensor.dim() == 0:
            trailing[name] = None
            continue
        trailing[name] = tuple(shapes[pieces[name][0].key][1:])
        if any(tuple(shapes[p.key][1:]) != trailing[name] for p in pieces[name]):
            raise PlanError(f"{name}: made of tensors with different trailing shapes")
    used = {p.key for parts in pieces.values() for p in parts}
    return ConversionPlan(MappingProxyType(pieces), MappingProxyType(trailing), tuple(k for k in keys if k not in used))


def _runs(keys: list[str], source: torch.Tensor, row: torch.Tensor) -> tuple[Piece, ...]:
    """Group (source, row) pairs into maximal runs of consecutive rows of one source tensor."""
    breaks = ((source[1:] != source[:-1]) | (row[1:] != row[:-1] + 1)).nonzero().flatten() + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), source.numel()]
    return tuple(Piece(keys[int(source[a])], int(row[a]), int(row[b - 1]) + 1) for a, b in zip(starts, ends))
