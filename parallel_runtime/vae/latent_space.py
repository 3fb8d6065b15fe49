"""A LATENT as ComfyUI keeps it for a family -> the latent the family's VAE decoder takes.

- FLUX.2: ComfyUI's LATENT is the VAE latent packed 2x2 (channel order c, p, q: 4x the channels at half
  the size) and normalised with the VAE's batch-norm running statistics (ComfyUI's FLUX.2 VAE does both
  itself; Flux2Pipeline does them around its transformer). Undone here:
  ``z = unpack(latent * sqrt(running_var + eps) + running_mean)``, then the usual AutoencoderKL decoder.
- Wan-style (causal 3-D) VAEs (Qwen-Image's ``AutoencoderKLQwenImage``) decode frames: an image is one frame
  (``vae.wan``).
"""

from __future__ import annotations

import torch
from torch import nn


def to_vae_space(vae: nn.Module, latent: torch.Tensor) -> torch.Tensor:
    """``latent`` [B, C, H, W] (ComfyUI's convention for the VAE's family) as the VAE decoder's input."""
    bn = getattr(vae, "bn", None)
    patch = getattr(getattr(vae, "config", None), "patch_size", None)
    if not isinstance(bn, nn.BatchNorm2d) or patch is None:
        return latent
    p, q = patch
    mean = bn.running_mean.view(1, -1, 1, 1).to(latent)
    std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(latent)
    x = latent * std + mean
    b, c, h, w = x.shape
    x = x.reshape(b, c // (p * q), p, q, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // (p * q), h * p, w * q)


def from_vae_space(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_vae_space` (a VAE encoder's latent as ComfyUI's LATENT)."""
    bn = getattr(vae, "bn", None)
    patch = getattr(getattr(vae, "config", None), "patch_size", None)
    if not isinstance(bn, nn.BatchNorm2d) or patch is None:
        return z
    p, q = patch
    b, c, h, w = z.shape
    x = z.reshape(b, c, h // p, p, w // q, q).permute(0, 1, 3, 5, 2, 4).reshape(b, c * p * q, h // p, w // q)
    mean = bn.running_mean.view(1, -1, 1, 1).to(x)
    std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(x)
    return (x - mean) / std
