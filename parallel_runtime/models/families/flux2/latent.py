"""FLUX.2's latent format: ComfyUI's LATENT is already the VAE latent packed 2x2 and normalised with the
VAE's batch-norm statistics (ComfyUI's FLUX.2 VAE does both), so the model space is the LATENT (identity).

Preview factors: ComfyUI 0.3.64 (this project's reference) has no FLUX.2 support, hence no factors to match.
"""

from __future__ import annotations

from ...latent_formats import LatentFormat


def latent_format(channels: int) -> LatentFormat:
    """The identity format of a ``channels``-channel packed latent (128 for FLUX.2 dev)."""
    return LatentFormat(channels, 1.0, 0.0)
