"""Latents <-> token grids, for images [B, C, H, W] and videos [B, C, T, H, W].

A token covers ``p x p`` latent pixels of one frame (every supported video family patches one frame per
token), so the tokens of a video are row-major over (T, H/p, W/p) and the grid is (frames, rows, cols);
an image's grid is (rows, cols). Inside a token the channels are ordered (c, p, q) ("cpq", Flux's
packing) or (p, q, c) ("pqc", the patch embeddings of SD3, PixArt and Wan).

Stacked view: a video latent reshaped to [B, C, T*H, W] (frames stacked vertically). Because a token
never spans frames, a band of whole token rows of this view is a contiguous range of the token
sequence, so row-band machinery written for images (PipeFusion patches, per-patch samplers) works on
videos unchanged; ``unpatchify`` with a 2-D grid of the view gives exactly the stacked view back.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..errors import ConfigError

PatchLayout = Literal["cpq", "pqc"]


def token_count(grid: tuple[int, ...]) -> int:
    return math.prod(grid)


def grid_of(x: torch.Tensor, patch: int, latent_dims: int, family: str, vae_scale_factor: int) -> tuple[int, ...]:
    """The token grid of a latent: (rows, cols) for [B, C, H, W], (frames, rows, cols) for [B, C, T, H, W]."""
    if x.ndim != latent_dims + 2:
        kind = (
            "video latents [batch, channels, frames, height, width]"
            if latent_dims == 3
            else ("image latents [batch, channels, height, width]")
        )
        raise ConfigError(
            f"a latent of shape {tuple(x.shape)} for {family}",
            f"{family} takes {kind}",
            "use an empty latent or encoded input made for this model (video models: EmptyHunyuanLatentVideo, "
            "WanImageToVideo, Wan22ImageToVideoLatent or Parallel Empty Latent with frames)"
            if latent_dims == 3
            else "use an image latent (EmptyLatentImage, VAE Encode, Parallel Empty Latent)",
        )
    h, w = x.shape[-2:]
    if h % patch or w % patch:
        raise ConfigError(
            f"latent of size {h}x{w} does not divide into {patch}x{patch} patches",
            f"{family} turns each {patch}x{patch} latent patch into one token",
            f"use a width and height that are multiples of {patch * vae_scale_factor} pixels",
        )
    return (*x.shape[2:-2], h // patch, w // patch)


def patchify(x: torch.Tensor, patch: int, grid: tuple[int, ...], layout: PatchLayout) -> torch.Tensor:
    """[B, C, (T,) H, W] -> [B, tokens, C*p*p], tokens row-major over the grid."""
    b, c = x.shape[:2]
    frames = grid[0] if len(grid) == 3 else 1
    gh, gw = grid[-2:]
    if len(grid) == 3:  # frames join the batch: the patches of each frame are an image's
        x = x.transpose(1, 2).reshape(b * frames, c, gh * patch, gw * patch)
    x = x.reshape(b * frames, c, gh, patch, gw, patch)
    order = (0, 2, 4, 1, 3, 5) if layout == "cpq" else (0, 2, 4, 3, 5, 1)
    return x.permute(*order).reshape(b, frames * gh * gw, c * patch * patch)


def unpatchify(
    tokens: torch.Tensor, grid: tuple[int, ...], patch: int, channels: int, layout: PatchLayout
) -> torch.Tensor:
    """[B, tokens, channels*p*p] -> [B, channels, (T,) H, W] for a 2-D or 3-D ``grid``."""
    b = tokens.shape[0]
    frames = grid[0] if len(grid) == 3 else 1
    gh, gw = grid[-2:]
    t = tokens.reshape(b * frames, gh, gw, *((channels, patch, patch) if layout == "cpq" else (patch, patch, channels)))
    t = t.permute(0, 3, 1, 4, 2, 5) if layout == "cpq" else t.permute(0, 5, 1, 3, 2, 4)
    x = t.reshape(b * frames, channels, gh * patch, gw * patch)
    if len(grid) == 3:
        x = x.reshape(b, frames, channels, gh * patch, gw * patch).transpose(1, 2)
    return x


def stacked(x: torch.Tensor) -> torch.Tensor:
    """A video latent as its stacked view [B, C, T*H, W] (images unchanged)."""
    return x.flatten(2, 3) if x.ndim == 5 else x


def unstacked(x: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """The stacked view back to [B, C, *size] (``size`` = (H, W) or (T, H, W))."""
    return x.reshape(*x.shape[:2], *size)


def band_and_tail(t: torch.Tensor, dim: int, band: tuple[int, int], end: int, tail: int) -> torch.Tensor:
    """Tokens ``band`` of ``t`` along ``dim``, then the ``tail`` tokens from ``end`` on (an edit model's
    reference tokens after the image's)."""
    t0, t1 = band
    if not tail or t1 == end:
        return t.narrow(dim, t0, t1 - t0 + tail)
    return torch.cat([t.narrow(dim, t0, t1 - t0), t.narrow(dim, end, tail)], dim=dim)
