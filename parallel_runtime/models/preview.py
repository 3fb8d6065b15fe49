"""Live previews: a step's x0 prediction as a small RGB picture, made on the worker that holds it.

A family states ComfyUI's latent -> RGB factors of each latent format it uses (``FamilySpec.previews``; the
one for a loaded model by ``FamilySpec.preview_for``); a preview pixel is ``bias + sum_c x0[c] * factor[c]``
on the latent in model space, mapped to bytes as ComfyUI maps its previews (-1..1 -> 0..255). A video shows a
sheet of its frames (up to ``MAX_FRAMES``, evenly spaced, first and last included). A family without factors
(FLUX.2: ComfyUI 0.3.64, the reference, states none) shows the three principal components of its latent in
false colour: where things are and how they separate, not their colours.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .families.registry import find_family

if TYPE_CHECKING:
    from .base import ModelPlan
    from .families.spec import LatentPreview
    from .latent_formats import LatentFormat

MAX_SIDE = 256  # the picture's longest side in pixels (one latent pixel each, fewer for big latents)
MAX_FRAMES = 16  # frames on a video's sheet


def preview_factors(family_id: str, latent_format: LatentFormat) -> LatentPreview | None:
    """The factors the family states for latents of ``latent_format`` (None: none; previews are false colour)."""
    spec = find_family(family_id)
    return None if spec is None else spec.preview_for(latent_format)


def plan_preview(plan: ModelPlan, x0: torch.Tensor) -> torch.Tensor:
    """The preview a model of ``plan`` (its family, its latent format) shows of its x0 prediction ``x0``."""
    return preview_image(x0, preview_factors(plan.family, plan.latent_format))


def frame_picks(frames: int, most: int = MAX_FRAMES) -> list[int]:
    """Up to ``most`` frame indices of ``frames``, evenly spaced, the first and the last included."""
    if frames <= most:
        return list(range(frames))
    return sorted({round(i * (frames - 1) / (most - 1)) for i in range(most)})


def preview_image(x0: torch.Tensor, factors: LatentPreview | None) -> torch.Tensor:
    """The first batch item of ``x0`` (model space, [B, C, H, W] or a video's [B, C, T, H, W]) as uint8 RGB
    [height, width, 3]: its picture, or a sheet of its frames (row by row)."""
    x = x0[0].detach().float().cpu()
    frames = x.unsqueeze(1) if x.ndim == 3 else x[:, frame_picks(x.shape[1])]  # [C, T, H, W]
    count = frames.shape[1]
    columns = math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    h, w = frames.shape[-2:]
    scale = min(1.0, MAX_SIDE / (columns * w), MAX_SIDE / (rows * h))
    if scale < 1.0:  # averaging commutes with the linear colour map: shrink the latent first
        size = (max(1, round(h * scale)), max(1, round(w * scale)))
        frames = F.interpolate(frames.transpose(0, 1), size=size, mode="area").transpose(0, 1)
        h, w = size
    rgb = _factor_colours(frames, factors) if factors is not None else _component_colours(frames)  # [T, H, W, 3]
    sheet = torch.full((rows * h, columns * w, 3), -1.0)
    for index in range(count):
        r, c = divmod(index, columns)
        sheet[r * h : (r + 1) * h, c * w : (c + 1) * w] = rgb[index]
    return ((sheet + 1.0) / 2.0).clamp(0.0, 1.0).mul(255).to(torch.uint8)


def _factor_colours(frames: torch.Tensor, factors: LatentPreview) -> torch.Tensor:
    """[C, T, H, W] -> [T, H, W, 3] with the family's factors (one RGB row per latent channel, plus a bias)."""
    weights = torch.tensor(factors.rgb_factors, dtype=torch.float32)  # [C, 3]
    if weights.shape[0] != frames.shape[0]:
        return _component_colours(frames)  # factors for another channel count: no meaningful colours
    rgb = torch.einsum("cthw,ck->thwk", frames, weights)
    if factors.rgb_bias is not None:
        rgb = rgb + torch.tensor(factors.rgb_bias, dtype=torch.float32)
    return rgb


def _component_colours(frames: torch.Tensor) -> torch.Tensor:
    """[C, T, H, W] -> [T, H, W, 3]: the latent's three principal components over every shown pixel, signed so
    each one's largest channel loading is positive, all scaled by one factor that brings the first to -1..1 (a
    weak component stays faint instead of blowing its noise up); the same basis for every frame."""
    channels = frames.shape[0]
    flat = frames.reshape(channels, -1)
    centred = flat - flat.mean(dim=1, keepdim=True)
    basis = torch.linalg.svd(centred, full_matrices=False)[0][:, :3]  # [C, <=3]
    signs = torch.sign(basis.gather(0, basis.abs().argmax(dim=0, keepdim=True)))
    basis = basis * torch.where(signs == 0, torch.ones_like(signs), signs)
    components = basis.T @ centred  # [<=3, N]
    peak = components[:1].abs().amax().clamp_min(1e-12)
    components = components / peak
    if components.shape[0] < 3:
        components = torch.cat([components, components.new_zeros(3 - components.shape[0], components.shape[1])])
    return components.T.reshape(*frames.shape[1:], 3)
