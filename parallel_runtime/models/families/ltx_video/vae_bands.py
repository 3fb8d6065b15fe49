"""LTX-Video's VAE (diffusers ``AutoencoderKLLTXVideo``) as the band-parallel video decode sees it.

The decoder is 3-D convs padded in time by repeating the edge frames (before and after: the 0.9 decoder is not
causal) and in space with zeros, per-pixel RMS norms and LayerNorms, pixel-shuffle upsampling after a conv, and a
4x4 pixel unpatchify at the end; no GroupNorm, no attention. Only the convs look beyond a pixel's rows: each is
stated as zero padding of the rows (the band halos) and a padding wrapper that repeats the edge frames and pads
the width with zeros, then the conv without padding of its own. The latent is un-normalised first with the VAE's
own per-channel statistics (``latents_mean`` / ``latents_std``, scaling factor 1), as diffusers' pipeline and
ComfyUI's VAE do. Decoders that inject noise (``decoder_inject_noise``: random spatial noise, which a band cannot
reproduce) or take a decode timestep (0.9.1+) are refused with the way out: ComfyUI's VAE Decode on the LATENT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...video_vae import BandLayers, CausalConv, VideoVae

VAE_CLASS = "AutoencoderKLLTXVideo"
_FIX = (
    "decode the LATENT with ComfyUI's VAE Decode and the model's VAE (CheckpointLoaderSimple / VAELoader), "
    "or use the LTX-Video 0.9.0 VAE as published"
)


class _FramesThenConv(nn.Module):
    """Repeat the edge frames (``before`` / ``after``), zero-pad the width, then ``conv`` without its padding."""

    def __init__(self, conv: nn.Conv3d, before: int, after: int):
        super().__init__()
        self.conv, self.before, self.after = conv, before, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[:, :, :1]] * self.before + [x] + [x[:, :, -1:]] * self.after, dim=2)
        pad_w = self.conv.padding[2]
        x = F.pad(x, (pad_w, pad_w)) if pad_w else x
        return F.conv3d(x, self.conv.weight, self.conv.bias, self.conv.stride, 0, self.conv.dilation, self.conv.groups)


def band_layers(vae: nn.Module) -> BandLayers:
    """The decoder's convs as band convs; raises for a decoder a band decode would get wrong."""
    config = vae.config
    if any(config.decoder_inject_noise) or config.timestep_conditioning:
        raise ConfigError(
            "the parallel LTX-Video VAE decode of a decoder with noise injection or a decode timestep (0.9.1+)",
            "its random spatial noise and timestep modulation are not split over row bands yet",
            _FIX,
        )
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
        if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.padding_mode != "zeros":
            raise ConfigError(
                f"the parallel LTX-Video VAE decode cannot split decoder.{name}",
                f"each rank decodes a band of rows: exact for stride-1 zero-padded convs ({conv.stride}, "
                f"{conv.padding_mode})",
                _FIX,
            )
        before, after = (kt - 1, 0) if module.is_causal else ((kt - 1) // 2, (kt - 1) // 2)
        pad_h = conv.padding[1]
        convs.append(CausalConv(module, _FramesThenConv(conv, before, after), (0, 0, pad_h, pad_h, 0, 0), "constant"))
    return BandLayers(tuple(convs), (), ())


def decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The decoder on ``z`` (model space: the VAE's statistics un-normalise it first), whole: no tiles."""
    shape = (1, -1, 1, 1, 1)
    mean, std = vae.latents_mean.view(shape).to(z), vae.latents_std.view(shape).to(z)
    return vae.decoder(z * std / vae.config.scaling_factor + mean)


VIDEO_VAE = VideoVae(
    vae_class=VAE_CLASS,
    layers=band_layers,
    decode=decode,
    latent_channels=lambda vae: int(vae.config.latent_channels),
    spatial_factor=lambda vae: int(vae.spatial_compression_ratio),
    output_frames=lambda latent_frames: 1 + 8 * (latent_frames - 1),
    causal_attention=lambda vae: False,
)
