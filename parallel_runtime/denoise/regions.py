"""Where a conditioning entry applies: ComfyUI's area and mask conditioning, as KSampler weighs it.

An entry may hold an area (ConditioningSetArea: latent pixels; ConditioningSetAreaPercentage: fractions
of the latent) and / or a mask (ConditioningSetMask, with its strength and "mask bounds", which turns the
mask's bounding box into the area). Once the latent's size is known each entry gets a :class:`Placement`:
the latent window its model call sees (the whole latent without an area) and its weight there, per pixel:

- with a mask: the mask resized bilinearly to the latent, cut to the window, times the mask strength and
  the entry's strength;
- with an area and no mask: the strength, ramped down linearly over up to 8 latent pixels (a quarter of
  the window at most) along each window edge that lies inside the latent;
- neither: the strength alone.

A branch's prediction is the sum of its active entries' predictions times their weights, each placed in
its window, divided by the summed weights (from a floor of 1e-37). Before sampling, every area of one branch
gets a partner in the other branch (:func:`pair_areas`): the other branch's entry whose area holds it most
tightly (or its entry without an area) is repeated over that area, so both branches cover the same windows.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ..errors import ConfigError

FEATHER = 8  # latent pixels an area's inner edges ramp over (at most a quarter of the window)
BOUNDS_MIN = 8  # the least height / width of a "mask bounds" area, in latent pixels
Area = tuple[int, int, int, int]  # (height, width, y, x) in latent pixels


@dataclasses.dataclass(frozen=True, eq=False)
class Region:
    """An entry's area and mask options, before the latent's size is known."""

    area: Area | None = None  # latent pixels (ConditioningSetArea: pixels // 8)
    area_fraction: tuple[float, float, float, float] | None = None  # (height, width, y, x) of the latent
    mask: torch.Tensor | None = None  # [H, W] or [B, H, W], any size (resized to the latent)
    mask_strength: float = 1.0
    set_area_to_bounds: bool = False  # the mask's bounding box becomes the area ("mask bounds")

    def __post_init__(self) -> None:
        if self.area is not None and self.area_fraction is not None:
            raise ConfigError(
                "a conditioning entry with both a pixel area and a percentage area",
                "an entry has one area",
                "set the area with one node (ConditioningSetArea or ConditioningSetAreaPercentage)",
            )
        if self.area is not None and (len(self.area) != 4 or min(self.area[:2]) < 1 or min(self.area[2:]) < 0):
            raise ConfigError(
                f"conditioning area {self.area!r}",
                "an area is (height, width, y, x) in latent pixels, with a size of at least 1",
                "set a width and height of at least 8 px in ConditioningSetArea",
            )
        if self.mask is not None and (self.mask.ndim not in (2, 3) or self.mask.numel() == 0):
            raise ConfigError(
                f"a conditioning mask of shape {tuple(self.mask.shape)}",
                "a MASK is [height, width] or [batch, height, width]",
                "connect a MASK output (LoadImageMask, SolidMask, ...) to ConditioningSetMask",
            )

    def resolved_area(self, size: tuple[int, int]) -> Area | None:
        """The area in latent pixels for a latent of ``size`` (H, W), before it is clipped to the latent."""
        if self.mask is not None and self.set_area_to_bounds:
            return _bounds(self.resized_mask(size))
        if self.area_fraction is not None:
            fh, fw, fy, fx = self.area_fraction
            h, w = size
            return (max(1, round(fh * h)), max(1, round(fw * w)), round(fy * h), round(fx * w))
        return self.area

    def resized_mask(self, size: tuple[int, int]) -> torch.Tensor:
        """The mask [B, H, W] at the latent's size (bilinear, as KSampler resizes it)."""
        assert self.mask is not None
        mask = self.mask.float()
        mask = mask.unsqueeze(0) if mask.ndim == 2 else mask
        if tuple(mask.shape[1:]) != tuple(size):
            mask = F.interpolate(mask.unsqueeze(1), size=tuple(size), mode="bilinear").squeeze(1)
        return mask


def _bounds(mask: torch.Tensor) -> Area:
    """The bounding box of the mask's non-zero pixels over the batch, at least BOUNDS_MIN a side."""
    hit = mask.abs().amax(dim=0) != 0
    if not bool(hit.any()):
        return (BOUNDS_MIN, BOUNDS_MIN, 0, 0)
    ys, xs = torch.nonzero(hit, as_tuple=True)
    y0, y1, x0, x1 = int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max())
    return (max(BOUNDS_MIN, y1 - y0 + 1), max(BOUNDS_MIN, x1 - x0 + 1), y0, x0)


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """An entry's window in the latent and its weight there ([B, C, h, w] tensor, or a number)."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    weight: torch.Tensor | float
    whole: bool  # the window is the whole latent (the entry's model call sees the whole latent)

    def crop(self, x: torch.Tensor) -> torch.Tensor:
        """The window of ``x`` [B, C, H, W] (``x`` itself for the whole latent)."""
        if self.whole:
            return x
        return x[..., self.rows[0] : self.rows[1], self.cols[0] : self.cols[1]]

    def weight_rows(self, r0: int, r1: int) -> torch.Tensor | float:
        """The weight of the window's rows r0:r1 (window coordinates)."""
        if isinstance(self.weight, float):
            return self.weight
        return self.weight[..., r0:r1, :]


def place(
    region: Region | None, strength: float, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> Placement:
    """The placement of an entry with ``region`` and ``strength`` on a latent of ``shape`` [B, C, H, W]."""
    if region is None:
        return Placement((0, shape[-2]), (0, shape[-1]), float(strength), True)
    if len(shape) != 4:
        raise ConfigError(
            f"area or mask conditioning on a latent of shape {tuple(shape)}",
            "areas and masks are supported on image latents [batch, channels, height, width]",
            "remove ConditioningSetArea / ConditioningSetMask for a video model, or use ComfyUI's KSampler",
        )
    b, c, h, w = shape
    if region.mask is None and region.resolved_area((h, w)) is None:
        return Placement((0, h), (0, w), float(strength), True)
    area = region.resolved_area((h, w))
    if area is None:
        ah, aw, y, x = h, w, 0, 0
    else:
        ah, aw, y, x = area
        if y >= h or x >= w:
            raise ConfigError(
                f"a conditioning area at x={x}, y={y} (latent pixels) of a {w}x{h} latent",
                "the area starts outside the latent, so it covers nothing (ComfyUI's KSampler fails there)",
                "move the area inside the image (ConditioningSetArea's x / y, in pixels, are 8x the latent's)",
            )
        ah, aw = min(ah, h - y), min(aw, w - x)
    if region.mask is not None:
        mask = region.resized_mask((h, w))[:b, y : y + ah, x : x + aw] * region.mask_strength
        if b % mask.shape[0]:
            raise ConfigError(
                f"a conditioning mask of batch {mask.shape[0]} for a latent batch of {b}",
                "each latent needs its mask, or one mask serves all",
                "give one mask, or as many masks as latents",
            )
        weight = mask.unsqueeze(1).repeat(b // mask.shape[0], c, 1, 1) * strength
    else:
        weight = torch.full((b, c, ah, aw), float(strength))
        _feather(weight, (y, x), (h, w))
    whole = (ah, aw, y, x) == (h, w, 0, 0)
    return Placement((y, y + ah), (x, x + aw), weight.to(device), whole)


def _feather(weight: torch.Tensor, offsets: tuple[int, int], size: tuple[int, int]) -> None:
    """Ramp the weight linearly over the window's edges that lie inside the latent (in place)."""
    for axis, (offset, full) in enumerate(zip(offsets, size)):
        dim = axis + 2
        length = weight.shape[dim]
        ramp = min(FEATHER, length // 4)
        steps = [(t + 1) / ramp for t in range(ramp)]
        if offset != 0:
            for t, factor in enumerate(steps):
                weight.narrow(dim, t, 1).mul_(factor)
        if offset + length < full:
            for t, factor in enumerate(steps):
                weight.narrow(dim, length - 1 - t, 1).mul_(factor)


def _inside(inner: Area, outer: Area) -> bool:
    (ih, iw, iy, ix), (oh, ow, oy, ox) = inner, outer
    return iy >= oy and ix >= ox and iy + ih <= oy + oh and ix + iw <= ox + ow


def pair_areas(branches: list[list], size: tuple[int, int]) -> list[list]:
    """Give each area of one branch a partner of the same area in the other branch (KSampler's rule).

    ``branches`` are lists of entries (``CondEntry``), positive first; the lists are extended in place, the
    positive's areas first, then the negative's (its added partners included). The partner repeats the
    area-holding entry (its area, mask, strengths and timestep range) with the text and guidance of the other
    branch's entry whose area holds it most tightly (an entry without an area if none does)."""
    if len(branches) != 2:
        return branches
    for me, other in ((0, 1), (1, 0)):
        for entry in list(branches[me]):
            area = _area_of(entry, size)
            if area is not None:
                _add_partner(branches[other], entry, area, size)
    return branches


def _area_of(entry, size: tuple[int, int]) -> Area | None:
    return None if entry.region is None else entry.region.resolved_area(size)


def _add_partner(entries: list, entry, area: Area, size: tuple[int, int]) -> None:
    tightest, tightest_area = None, None
    for candidate in entries:
        cand_area = _area_of(candidate, size)
        if cand_area is None:
            if tightest is None:
                tightest = candidate
            continue
        if not _inside(area, cand_area):
            continue
        if tightest is None or tightest_area is None or math.prod(tightest_area[:2]) > math.prod(cand_area[:2]):
            tightest, tightest_area = candidate, cand_area
    if tightest is None or tightest_area == area:
        return
    entries.append(dataclasses.replace(entry, cond=tightest.cond, guidance=tightest.guidance))
