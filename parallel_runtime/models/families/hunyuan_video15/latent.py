"""HunyuanVideo 1.5's latent format: 32 channels, one scale (1.03682: diffusers' ``AutoencoderKLHunyuanVideo15``
``scaling_factor``, which a later ComfyUI's ``latent_formats.HunyuanVideo15`` states too), no shift."""

from __future__ import annotations

from ...latent_formats import LatentFormat

HUNYUAN_VIDEO15 = LatentFormat(channels=32, scale=1.03682)
