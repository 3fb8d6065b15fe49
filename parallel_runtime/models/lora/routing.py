"""Where each tensor of a model's ORIGINAL layout lives in the loaded diffusers model, row by row.

LoRA files for Flux, SD3 and PixArt often name the original layout's tensors (``double_blocks.0.img_attn.qkv``),
which the loaded diffusers model holds split (``to_q``, ``to_k``, ``to_v``), renamed or with reordered rows
(Flux's final modulation swaps its scale and shift halves). Instead of a second hand-written map, the
routing is the inverse of the model's conversion plan (:mod:`..conversion_plan`, which probes
``original_layout.to_diffusers`` - diffusers' checkpoint converters - with row-id tensors): each converted
tensor says which rows of which original tensor it holds. Every conversion of these families moves whole
rows (split, rename, swap), which the plan checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ...errors import ConfigError
from ..conversion_plan import ConversionPlan, PlanError, plan_conversion

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

    try:
        plan = plan_conversion(lambda state: to_diffusers(family, state, dict(config)), skeleton)
    except PlanError as exc:
        raise ConfigError(
            f"the {family} converter changed more than the rows of a tensor ({exc})",
            "LoRA patches in the original layout are routed row by row through the model's converter",
            "use a LoRA saved under diffusers names for this model, or report the converter change",
        ) from exc
    return routing_of_plan(plan, skeleton)


def routing_of_plan(plan: ConversionPlan, skeleton: Mapping[str, tuple[int, ...]]) -> Routing:
    """The inverse of a conversion plan: for each original tensor, the diffusers tensors holding its rows."""
    pieces: dict[str, list[Piece]] = {}
    owner: dict[str, str] = {}
    for param, parts in plan.pieces.items():
        sources = plan.sources(param)
        if len(sources) != 1:
            raise ConfigError(
                f"{param} mixes rows of several original tensors ({', '.join(sources)})",
                "each diffusers tensor must come from one original tensor for row routing",
                "use a LoRA saved under diffusers names for this model",
            )
        pieces.setdefault(sources[0], []).append(Piece(param, tuple((p.r0, p.r1) for p in parts)))
        owner[param] = sources[0]
    routes = {name: Route(name, _rows(skeleton[name]), tuple(found)) for name, found in pieces.items()}
    return Routing(routes, owner)


def _rows(shape: tuple[int, ...]) -> int:
    return int(shape[0]) if len(shape) else 1
