"""PixArt's latent formats and preview factors: ComfyUI 0.3.64 tells PixArt-alpha (micro-conditions) from Sigma
and gives alpha SD1.5's format (``latent_formats.SD15``) and Sigma SDXL's (``latent_formats.SDXL``), 4 channels."""

from __future__ import annotations

from ...latent_formats import LatentFormat
from ..spec import LatentPreview

ALPHA_SCALE, SIGMA_SCALE = 0.18215, 0.13025


def latent_format(channels: int, alpha: bool) -> LatentFormat:
    """PixArt-alpha's (``alpha``: the micro-conditions of alpha 1024) or Sigma's scale for ``channels``."""
    return LatentFormat(channels, ALPHA_SCALE if alpha else SIGMA_SCALE)


SD15_PREVIEW = LatentPreview(
    "SD15",
    (
        (0.3512, 0.2297, 0.3227), (0.3250, 0.4974, 0.2350), (-0.2829, 0.1762, 0.2721), (-0.2120, -0.2616, -0.7177),
    ),
)  # fmt: skip

SDXL_PREVIEW = LatentPreview(
    "SDXL",
    (
        (0.3651, 0.4232, 0.4341), (-0.2533, -0.0042, 0.1068), (0.1076, 0.1111, -0.0362), (-0.3165, -0.2492, -0.2188),
    ),
    (0.1084, -0.0175, -0.0011),
)  # fmt: skip


def preview_for(latent_format: LatentFormat) -> LatentPreview:
    """PixArt-alpha's latents (SD1.5's VAE, scale 0.18215) preview with SD1.5's factors, Sigma's (SDXL's VAE)
    with SDXL's, as ComfyUI gives each its format."""
    return SD15_PREVIEW if latent_format.scale == ALPHA_SCALE else SDXL_PREVIEW
