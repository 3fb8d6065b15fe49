"""LTX-2's video latent format: 128 channels in model space as the sampler holds them (scale 1, no shift).

Like LTX-Video 0.9's, the LTX-2 video VAE normalises its latents itself, per channel, with statistics stored in its
weights (diffusers' ``AutoencoderKLLTX2Video`` buffers ``latents_mean`` / ``latents_std``): diffusers'
``LTX2Pipeline`` denoises the normalised latent and un-normalises it before the decode. ComfyUI 0.3.64 has no
LTX-2, so there are no ComfyUI preview factors: previews are drawn in false colour.
"""

from __future__ import annotations

from ...latent_formats import LatentFormat

LTX2_VIDEO = LatentFormat(channels=128)
