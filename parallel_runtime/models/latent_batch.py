"""A conditioning tensor given for a batch of latents: one per latent, or fewer repeated to fill the batch."""

from __future__ import annotations

import torch

from ..errors import ConfigError


def repeated_to_batch(t: torch.Tensor, batch: int, what: str, why: str, fix: str) -> torch.Tensor:
    """``t`` [b, ...] for a latent batch of ``batch``: itself when b equals it, repeated when b divides it (one
    shared by all, or a group repeated, as ComfyUI repeats conditioning inputs); else a ConfigError naming ``what``."""
    if t.shape[0] == batch:
        return t
    if t.shape[0] and batch % t.shape[0] == 0:
        return t.repeat(batch // t.shape[0], *([1] * (t.ndim - 1)))
    raise ConfigError(f"{what} has batch {t.shape[0]} but the latent has batch {batch}", why, fix)
