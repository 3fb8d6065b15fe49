"""Latent formats: how a raw VAE latent (ComfyUI's LATENT) maps to the model's space and back.

Two kinds, as in ComfyUI's ``comfy.latent_formats``: one scale and shift for every channel (SD, SD3,
Flux, PixArt), or a mean and standard deviation PER CHANNEL (Wan 2.1 / 2.2, and the Wan-style VAEs of
later families): ``model = (raw - mean) * scale / std``, ``raw = model * std / scale + mean``. The
statistics broadcast over the channel dimension (dim 1) of a latent of any rank: images [B, C, H, W]
and videos [B, C, T, H, W] alike.

:data:`WAN21` (16 channels, also diffusers' ``AutoencoderKLWan`` defaults) and :data:`WAN22` (48
channels, TI2V-5B) carry the values of ComfyUI's ``Wan21`` / ``Wan22`` formats, which diffusers' Wan
pipelines apply as ``latents_mean`` / ``1 / latents_std``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LatentFormat:
    """Maps a raw VAE latent to model space and back (see the module doc)."""

    channels: int
    scale: float = 1.0
    shift: float = 0.0  # scalar formats only
    mean: tuple[float, ...] | None = None  # per-channel formats: one value per channel
    std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        per_channel = (self.mean is not None, self.std is not None)
        if any(per_channel):
            lengths = {len(v) for v in (self.mean or (), self.std or ())}
            problem = None
            if not all(per_channel):
                problem = "only one of mean and std is given"
            elif lengths != {self.channels}:
                problem = f"mean/std have {sorted(lengths)} values for {self.channels} channels"
            elif self.shift:
                problem = f"a per-channel format also has a scalar shift {self.shift}"
            elif not all(s > 0 and math.isfinite(s) for s in self.std):
                problem = "a standard deviation is not a positive number"
            if problem:
                raise ConfigError(
                    f"latent format: {problem}",
                    "a per-channel format normalises every channel by its own mean and standard deviation",
                    "give mean and std as sequences of one positive std (and one mean) per latent channel",
                )
        if not self.scale or not math.isfinite(self.scale):
            raise ConfigError(
                f"latent format scale {self.scale!r}",
                "the scale multiplies the latent into model space and is divided out again",
                "use a finite, non-zero scale (1.0 for per-channel formats)",
            )

    @property
    def per_channel(self) -> bool:
        return self.mean is not None

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mean and std shaped [1, C, 1, ...] for ``like`` (channels on dim 1)."""
        if like.ndim < 2 or like.shape[1] != self.channels:
            raise ConfigError(
                f"a latent of shape {tuple(like.shape)} for a {self.channels}-channel latent format",
                "per-channel statistics apply to the channel dimension (dim 1) of [B, C, ...] latents",
                f"pass a latent with {self.channels} channels on dim 1",
            )
        shape = (1, self.channels) + (1,) * (like.ndim - 2)
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device).view(shape)
        std = torch.tensor(self.std, dtype=like.dtype, device=like.device).view(shape)
        return mean, std

    def to_model(self, latent: torch.Tensor) -> torch.Tensor:
        if not self.per_channel:
            return (latent - self.shift) * self.scale
        mean, std = self._stats(latent)
        return (latent - mean) * self.scale / std

    def to_raw(self, z: torch.Tensor) -> torch.Tensor:
        if not self.per_channel:
            return z / self.scale + self.shift
        mean, std = self._stats(z)
        return z * std / self.scale + mean

    @classmethod
    def from_vae_config(cls, config: Any) -> LatentFormat:
        """The format a diffusers VAE config records: ``latents_mean`` / ``latents_std`` with ``z_dim``
        channels (AutoencoderKLWan and other Wan-style VAEs), else ``latent_channels``,
        ``scaling_factor``, ``shift_factor`` (AutoencoderKL)."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        mean, std = get("latents_mean", None), get("latents_std", None)
        if mean is not None and std is not None:
            channels = get("z_dim", None) or get("latent_channels", None) or len(mean)
            return per_channel(int(channels), mean, std)
        return cls(int(get("latent_channels")), float(get("scaling_factor")), float(get("shift_factor", None) or 0.0))


def per_channel(channels: int, mean: Sequence[float], std: Sequence[float], scale: float = 1.0) -> LatentFormat:
    """A per-channel format from sequences of floats."""
    return LatentFormat(channels, scale, 0.0, tuple(float(v) for v in mean), tuple(float(v) for v in std))


WAN21 = LatentFormat(
    channels=16,
    mean=(
        -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
        0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
    ),
    std=(
        2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
        3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
    ),
)  # fmt: skip

WAN22 = LatentFormat(
    channels=48,
    mean=(
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
        -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
        -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
        -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
        0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ),
    std=(
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
        0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
        0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
        0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
        0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ),
)  # fmt: skip
