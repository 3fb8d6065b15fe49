"""LTX-2's video VAE (diffusers ``AutoencoderKLLTX2Video``) as the band-parallel video decode sees it.

The decoder is 3-D convs padded in time by repeating the edge frames (the released decoder is not causal: before
and after; a causal one: before only) and in space by reflection (the release's ``decoder_spatial_padding_mode``;
zeros are taken too), per-pixel RMS norms, pixel-shuffle upsampling after a conv (with a pixel-shuffled residual),
1x1 shortcut convs and a 4x4 pixel unpatchify at the end; no GroupNorm, no attention. Only the 3x3x3 convs look
beyond a pixel's rows: each is stated as its rows padded in the conv's mode (band halos, reflected at the clip's
top and bottom) and a wrapper that repeats the edge frames and pads the width, then the conv without padding of
its own. The latent is un-normalised first with the VAE's per-channel statistics (``latents_mean`` /
``latents_std``, scaling factor 1), as LTX2Pipeline does before ``vae.decode``. Decoders that inject noise or take
a decode timestep (not the release's) are refused with the way out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...video_vae import BandLayers, CausalConv, VideoVae

VAE_CLASS = "AutoencoderKLLTX2Video"
_FIX = "decode the latent on one device with diffusers' AutoencoderKLLTX2Video, or use the LTX-2 VAE as published"
PAD_MODES = {"zeros": "constant", "reflect": "reflect"}


class _FramesThenConv(nn.Module):
    """Repeat the edge frames (``before`` / ``after``), pad the width in ``mode``, then ``conv`` without padding."""

    def __init__(self, conv: nn.Conv3d, before: int, after: int, mode: str):
        super().__init__()
        self.conv, self.before, self.after, self.mode = conv, before, after, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[:, :, :1]] * self.before + [x] + [x[:, :, -1:]] * self.after, dim=2)
        pad_w = self.conv.padding[2]
        x = F.pad(x, (pad_w, pad_w, 0, 0, 0, 0), mode=self.mode) if pad_w else x
        return F.conv3d(x, self.conv.weight, self.conv.bias, self.conv.stride, 0, self.conv.dilation, self.conv.groups)


def band_layers(vae: nn.Module) -> BandLayers:
    """The decoder's convs as band convs; raises for a decoder a band decode would get wrong."""
    config = vae.config
    if any(config.decoder_inject_noise) or config.timestep_conditioning:
        raise ConfigError(
            "the parallel LTX-2 VAE decode of a decoder with noise injection or a decode timestep",
            "its random spatial noise and timestep modulation are not split over row bands",
            _FIX,
        )
    conv_class = compat.ltx2_video_vae_conv_class()
    causal = bool(vae.decoder.is_causal)
    convs = []
    for name, module in vae.decoder.named_modules():
        if not isinstance(module, conv_class):
            wide = isinstance(module, nn.Conv3d) and any(k > 1 for k in module.kernel_size[1:])
            if (wide and not name.endswith(".conv")) or isinstance(module, (nn.Conv2d, nn.GroupNorm)):
                raise ConfigError(
                    f"the parallel LTX-2 VAE decode cannot split decoder.{name} ({type(module).__name__})",
                    "each rank decodes a band of rows: exact when only the decoder's LTX-2 convs look beyond a row",
                    _FIX,
                )
            continue
        conv = module.conv
        kt = conv.kernel_size[0]
        mode = PAD_MODES.get(conv.padding_mode)
        if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or mode is None:
            raise ConfigError(
                f"the parallel LTX-2 VAE decode cannot split decoder.{name}",
                f"each rank decodes a band of rows: exact for stride-1 convs padded with zeros or by reflection "
                f"({conv.stride}, {conv.padding_mode})",
                _FIX,
            )
        before, after = (kt - 1, 0) if causal else ((kt - 1) // 2, (kt - 1) // 2)
        pad_h = conv.padding[1]
        convs.append(CausalConv(module, _FramesThenConv(conv, before, after, mode), (0, 0, pad_h, pad_h, 0, 0), mode))
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
