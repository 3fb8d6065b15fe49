"""FLUX.1 Fill (flux1-fill-dev): inpainting through extra input channels, as ComfyUI's InpaintModelConditioning
hands them over (``concat_latent_image``, ``concat_mask`` on the CONDITIONING).

A Fill transformer reads, for every latent pixel, 96 channels instead of 16: the noisy latent (16), the
masked image's latent in model space (16) and the mask seen at pixel resolution, each latent pixel's 8x8
block of mask pixels as 64 channels (row-major within the block). Patched 2x2 as the latent is, that is
``img_in``'s 384 input features (64 + 64 + 256). The image is fitted to the latent's size and the mask to 8x
it (centre crop to the aspect, then bilinear), the mask's channels averaged first; the mask is taken as given
(not rounded or inverted: the node already greyed the masked pixels of the image).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras
from ...latent_formats import LatentFormat

MASK_BLOCK = 8  # mask pixels per latent pixel side (the VAE's factor)
FILL_FACTOR = 2 + MASK_BLOCK * MASK_BLOCK // 16  # input channels per latent channel: latent, image, mask (64 / 16)


@dataclasses.dataclass(frozen=True)
class FluxFillInputs(ConditioningExtras):
    """InpaintModelConditioning's image and mask for one conditioning entry."""

    concat_image: torch.Tensor  # [B, 16, h, w] raw (VAE-space) latent of the image with the masked pixels greyed
    concat_mask: torch.Tensor  # [B, C, H, W] the mask (1 = repaint) at any size, usually the image's pixels


def is_fill(in_channels: int | None, latent_channels: int | None, patch: int) -> bool:
    """Whether a transformer of ``in_channels`` token features is a Fill model for ``latent_channels``."""
    return bool(in_channels and latent_channels) and in_channels == FILL_FACTOR * latent_channels * patch * patch


def fill_inputs_of(cond: Conditioning) -> FluxFillInputs | None:
    """The Fill inputs ``cond`` carries (None when it carries none)."""
    return cond.extras if isinstance(cond.extras, FluxFillInputs) else None


def fitted(t: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``t`` [B, C, H, W] cut to the aspect of ``height`` x ``width`` about its centre, then resized to it
    (bilinear); unchanged when it already has that size."""
    h, w = t.shape[-2:]
    if (h, w) == (height, width):
        return t
    if w * height > h * width:  # wider than the target: trim both sides
        trim = round((w - h * width / height) / 2)
        t = t[..., :, trim : w - trim]
    elif w * height < h * width:  # taller: trim top and bottom
        trim = round((h - w * height / width) / 2)
        t = t[..., trim : h - trim, :]
    return functional.interpolate(t, size=(height, width), mode="bilinear")


def _batched(t: torch.Tensor, batch: int, what: str) -> torch.Tensor:
    if t.shape[0] == batch:
        return t
    if t.shape[0] == 1:
        return t.expand(batch, *t.shape[1:])
    raise ConfigError(
        f"the conditioning's {what} has batch {t.shape[0]} but the latent has batch {batch}",
        "each latent needs its own inpainting image and mask, or all share one",
        "give InpaintModelConditioning one image, or as many as latents",
    )


def fill_channels(x: torch.Tensor, inputs: FluxFillInputs, fmt: LatentFormat) -> torch.Tensor:
    """``x`` [B, 16, h, w] (model space) followed by the Fill channels made at its size: [B, 96, h, w]."""
    batch, (rows, cols) = x.shape[0], x.shape[-2:]
    image = fitted(inputs.concat_image.to(x.device, torch.float32), rows, cols)
    image = fmt.to_model(_batched(image, batch, "concat_latent_image"))
    mask = inputs.concat_mask.to(x.device, torch.float32).mean(dim=1, keepdim=True)
    mask = fitted(mask, rows * MASK_BLOCK, cols * MASK_BLOCK)
    mask = functional.pixel_unshuffle(_batched(mask, batch, "concat_mask"), MASK_BLOCK)  # 8x8 block -> 64 channels
    return torch.cat([x, image.to(x.dtype), mask.to(x.dtype)], dim=1)
