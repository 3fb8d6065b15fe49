"""LTX-Video's VAE (diffusers ``AutoencoderKLLTXVideo``) as the band-parallel video decode sees it.

The decoder is 3-D convs padded in time by repeating the edge frames (before and after: the 0.9 decoder is not
causal) and in space with zeros (or mirrored rows: see below), per-pixel RMS norms and LayerNorms, pixel-shuffle
upsampling after a conv, and a 4x4 pixel unpatchify at the end; no GroupNorm, no attention. Only the convs look
beyond a pixel's rows: each is stated as padding of the rows (the band halos; at the clip's border zeros or
mirrored rows) and a padding wrapper that repeats the edge frames and pads the width as the conv pads (zeros, or
reflect for the Lightricks files ComfyUI decodes with reflect padding), then the conv without padding of its own. The
latent is un-normalised first with the VAE's own per-channel statistics (``latents_mean`` / ``latents_std``, scaling
factor 1), as diffusers' pipeline and ComfyUI's VAE do.

0.9.1+ decoders (``timestep_conditioning``) decode as ComfyUI's VAE Decode does: the latent (normalised) is first
blended with noise, ``DECODE_NOISE_SCALE * noise + (1 - DECODE_NOISE_SCALE) * z``, and the decoder is conditioned on
the timestep ``DECODE_TIMESTEP`` (ComfyUI's defaults: 0.025 and 0.05); 0.9.1's decoder also adds random spatial
noise in its resnets (``decoder_inject_noise``). Every random number comes from the decode's seeded generator (see
``vae.causal3d``: drawn for the whole picture, so the video does not depend on the layout), in the order ComfyUI's
code draws them from torch's global generator: ComfyUI's decode equals ours when ``torch.manual_seed(seed)`` runs
right before it, on the same kind of device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...video_vae import BandLayers, CausalConv, SpatialNoise, VideoVae

VAE_CLASS = "AutoencoderKLLTXVideo"
DECODE_TIMESTEP = 0.05  # ComfyUI's VAE decode of a timestep-conditioned LTX VAE
DECODE_NOISE_SCALE = 0.025
PADDINGS = {"zeros": "constant", "reflect": "reflect"}  # the decoder's spatial padding -> the band border's
_FIX = (
    "decode the LATENT with ComfyUI's VAE Decode and the model's VAE (CheckpointLoaderSimple / VAELoader), "
    "or use the LTX-Video 0.9.0 VAE as published"
)


class _FramesThenConv(nn.Module):
    """Repeat the edge frames (``before`` / ``after``), pad the width as ``conv`` pads, then ``conv`` without padding."""

    def __init__(self, conv: nn.Conv3d, before: int, after: int):
        super().__init__()
        self.conv, self.before, self.after = conv, before, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[:, :, :1]] * self.before + [x] + [x[:, :, -1:]] * self.after, dim=2)
        pad_w = self.conv.padding[2]
        if pad_w:
            mode = PADDINGS[self.conv.padding_mode]
            x = F.pad(x, (pad_w, pad_w, 0, 0, 0, 0), mode=mode) if mode != "constant" else F.pad(x, (pad_w, pad_w))
        return F.conv3d(x, self.conv.weight, self.conv.bias, self.conv.stride, 0, self.conv.dilation, self.conv.groups)


def band_layers(vae: nn.Module) -> BandLayers:
    """The decoder's convs as band convs; raises for a decoder a band decode would get wrong."""
    conv_class = compat.ltx_video_vae_conv_class()
    convs = []
    for name, module in vae.decoder.named_modules():
        if not isinstance(module, conv_class):
            if isinstance(module, (nn.Conv2d, nn.Conv3d, nn.GroupNorm)) and not name.endswith(".conv"):
                raise ConfigError(
                    f"the parallel LTX-Video VAE decode cannot split decoder.{name} ({type(module).__name__})",
                    "each rank decodes a band of rows: exact when only the decoder's LTX convs look beyond a row",
                    _FIX,
                )
            continue
        conv = module.conv
        kt, _, _ = conv.kernel_size
        if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.padding_mode not in PADDINGS:
            raise ConfigError(
                f"the parallel LTX-Video VAE decode cannot split decoder.{name}",
                f"each rank decodes a band of rows: exact for stride-1 convs padded with zeros or reflect ({conv.stride}, "
                f"{conv.padding_mode})",
                _FIX,
            )
        before, after = (kt - 1, 0) if module.is_causal else ((kt - 1) // 2, (kt - 1) // 2)
        pad_h = conv.padding[1]
        padding = (0, 0, pad_h, pad_h, 0, 0)
        convs.append(CausalConv(module, _FramesThenConv(conv, before, after), padding, PADDINGS[conv.padding_mode]))
    return BandLayers(tuple(convs), (), (), _injected_noise(vae))


def _injected_noise(vae: nn.Module) -> tuple[SpatialNoise, ...]:
    """0.9.1's resnets add ``per_channel_scale1 * noise`` after conv1 and ``per_channel_scale2 * noise`` after conv2
    (diffusers' LTXVideoResnetBlock3d draws it from torch's global generator)."""
    noises = []
    for module in vae.decoder.modules():
        for scale, conv in (("per_channel_scale1", "conv1"), ("per_channel_scale2", "conv2")):
            if getattr(module, scale, None) is not None:
                noises.append(SpatialNoise(module, scale, getattr(module, conv)))
    return tuple(noises)


def perturb(vae: nn.Module, z: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The latent ComfyUI's decode of a 0.9.1+ VAE starts from: blended with noise (``DECODE_NOISE_SCALE``) drawn
    for the whole ``z`` from ``generator`` (as ``torch.randn_like(z)`` after ``torch.manual_seed``); z as it is for
    0.9.0."""
    if not vae.config.timestep_conditioning:
        return z
    noise = torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
    return noise * DECODE_NOISE_SCALE + (1.0 - DECODE_NOISE_SCALE) * z


def decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The decoder on ``z`` (model space: the VAE's statistics un-normalise it first), whole: no tiles; a 0.9.1+
    decoder conditioned on ``DECODE_TIMESTEP``."""
    shape = (1, -1, 1, 1, 1)
    mean, std = vae.latents_mean.view(shape).to(z), vae.latents_std.view(shape).to(z)
    temb = None
    if vae.config.timestep_conditioning:  # one timestep per clip (diffusers' decoder takes [B])
        temb = torch.full((z.shape[0],), DECODE_TIMESTEP, device=z.device, dtype=z.dtype)
    return vae.decoder(z * std / vae.config.scaling_factor + mean, temb)


VIDEO_VAE = VideoVae(
    vae_class=VAE_CLASS,
    layers=band_layers,
    decode=decode,
    latent_channels=lambda vae: int(vae.config.latent_channels),
    spatial_factor=lambda vae: int(vae.spatial_compression_ratio),
    output_frames=lambda latent_frames: 1 + 8 * (latent_frames - 1),
    causal_attention=lambda vae: False,
    perturb=perturb,
)
