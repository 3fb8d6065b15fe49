"""Where each tensor of a model's ORIGINAL layout lives in the loaded diffusers model, row by row.

LoRA files for Flux, SD3 and PixArt often name the original layout's tensors (``double_blocks.0.img_attn.qkv``),
which the loaded diffusers model holds split (``to_q``, ``to_k``, ``to_v``), renamed or with reordered rows
(Flux's final modulation swaps its scale and shift halves). Instead of a second hand-written map, the
model's own converter (``original_layout.to_diffusers``, which wraps diffusers' checkpoint converters) is
run once on a probe state dict in which every tensor is a column of row numbers: each converted tensor
then says which rows of which original tensor it holds. Every conversion of these families moves whole
rows (split, rename, swap), which the probe checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ...errors import ConfigError

Segment = tuple[int, int]  # rows [start, stop) of the original tensor


@dataclasses.dataclass(frozen=True)
class Piece:
    """One diffusers tensor made of rows of an original tensor (in this order)."""

    param: str
    segments: tuple[Segment, ...]

    @property
    def rows(self) -> int:
        return sum(stop - start for start, stop in self.segments)

    def index(self) -> torch.Tensor:
        """The original rows of this piece, as an index tensor."""
        return torch.cat([torch.arange(start, stop) for start, stop in self.segments])


@dataclasses.dataclass(frozen=True)
class Route:
    """An original tensor (``rows`` rows) and the diffusers tensors that hold its rows."""

    original: str
    rows: int
    pieces: tuple[Piece, ...]

    def piece(self, param: str) -> Piece:
        return next(p for p in self.pieces if p.param == param)


@dataclasses.dataclass(frozen=True)
class Routing:
    """Routes by original name, and for every diffusers tensor the original it belongs to."""

    routes: Mapping[str, Route]
    owner: Mapping[str, str]  # diffusers tensor -> original tensor

    def group_of(self, param: str) -> Route:
        return self.routes[self.owner[param]]


def identity_routing(params: Mapping[str, tuple[int, ...]]) -> Routing:
    """Routing of a model without an original layout: every tensor is its own group."""
    routes = {}
    for name, shape in params.items():
        rows = shape[0] if shape else 1
        routes[name] = Route(name, rows, (Piece(name, ((0, rows),)),))
    return Routing(routes, {name: name for name in params})


def probe_routing(family: str, skeleton: Mapping[str, tuple[int, ...]], config: Mapping) -> Routing:
    """Routes of every tensor of ``skeleton`` (original names -> shapes) through the family's converter."""
    from ..original_layout import to_diffusers

    offsets: dict[str, int] = {}
    probe: dict[str, torch.Tensor] = {}
    total = 0
    for name, shape in skeleton.items():
        rows = int(shape[0]) if len(shape) else 1
        offsets[name] = total
        probe[name] = torch.arange(total, total + rows, dtype=torch.float64).reshape(rows, 1)
        total += rows
    starts = sorted((start, name) for name, start in offsets.items())
    converted = to_diffusers(family, dict(probe), dict(config))
    pieces: dict[str, list[Piece]] = {}
    owner: dict[str, str] = {}
    for param, column in converted.items():
        if column.device.type == "meta" or column.dim() != 2 or column.shape[1] != 1:
            raise ConfigError(
                f"the {family} converter changed more than the rows of {param}",
                "LoRA patches in the original layout are routed row by row through the model's converter",
                "use a LoRA saved under diffusers names for this model, or report the converter change",
            )
        values = column[:, 0].to(torch.int64)
        original = _owner(starts, int(values[0]))
        base = offsets[original]
        local = values - base
        if bool((local < 0).any()) or bool((local >= _rows(skeleton[original])).any()):
            raise ConfigError(
                f"{param} mixes rows of several original tensors",
                "each diffusers tensor must come from one original tensor for row routing",
                "use a LoRA saved under diffusers names for this model",
            )
        pieces.setdefault(original, []).append(Piece(param, _segments(local)))
        owner[param] = original
    routes = {name: Route(name, _rows(skeleton[name]), tuple(found)) for name, found in pieces.items()}
    return Routing(routes, owner)


def _rows(shape: tuple[int, ...]) -> int:
    return int(shape[0]) if len(shape) else 1


def _owner(starts: list[tuple[int, str]], value: int) -> str:
    lo, hi = 0, len(starts) - 1
    while lo < hi:  # the last start <= value
        mid = (lo + hi + 1) // 2
        if starts[mid][0] <= value:
            lo = mid
        else:
            hi = mid - 1
    return starts[lo][1]


def _segments(rows: torch.Tensor) -> tuple[Segment, ...]:
    """Runs of consecutive row numbers: [4,5,6,0,1] -> ((4, 7), (0, 2))."""
    values = rows.tolist()
    out: list[Segment] = []
    start = prev = values[0]
    for v in values[1:]:
        if v != prev + 1:
            out.append((start, prev + 1))
            start = v
        prev = v
    out.append((start, prev + 1))
    return tuple(out)
