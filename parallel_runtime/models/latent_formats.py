"""Latent formats: how a raw VAE latent (ComfyUI's LATENT) maps to the model's space and back.

Two kinds, as in ComfyUI's ``comfy.latent_formats``: one scale and shift for every channel (SD, SD3,
Flux, PixArt), or a mean and standard deviation PER CHANNEL (Wan 2.1 / 2.2, and the Wan-style VAEs of
later families): ``model = (raw - mean) * scale / std``, ``raw = model * std / scale + mean``. The
statistics broadcast over the channel dimension (dim 1) of a latent of any rank: images [B, C, H, W]
and videos [B, C, T, H, W] alike.

Each family states its formats' numbers in its folder (``families/<family>/latent.py``). Importing this
module is light (torch is imported when a latent is converted), so those statements are too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch


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
        import torch

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
