"""HunyuanVideo 1.5's VAE (diffusers ``AutoencoderKLHunyuanVideo15``) as the band-parallel video decode sees it.

Its decoder is causal 3-D convs (3x3x3, edges replicated), per-pixel RMS norms, pixel-shuffle upsampling after a
conv (each output row from one input row) and one mid-block attention over every pixel of every frame, masked
frame-causally; no GroupNorm. Only the convs and the attention look beyond a pixel's rows. Decoded whole, as
``vae.decode`` does without tiling.
"""

from __future__ import annotations

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...video_vae import Attend, BandLayers, CausalConv, VideoVae


def band_layers(vae: nn.Module) -> BandLayers:
    causal_class, attention_class = compat.hunyuan_video15_vae_layer_classes()
    convs, attentions, inner = [], [], set()
    for name, module in vae.decoder.named_modules():
        if isinstance(module, causal_class):
            conv = module.conv
            if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.padding != (0, 0, 0):
                raise ConfigError(
                    f"the parallel HunyuanVideo 1.5 VAE decode cannot split decoder.{name}",
                    "each rank decodes a band of rows: exact for stride-1 causal convs",
                    "decode this VAE on one device (vae.decode)",
                )
            convs.append(CausalConv(module, conv, tuple(module.time_causal_padding), module.pad_mode))
            inner.add(id(conv))
        elif isinstance(module, attention_class):
            attentions.append((module, attention))
        elif isinstance(module, nn.GroupNorm):
            raise ConfigError(
                f"a GroupNorm in decoder.{name} of a HunyuanVideo 1.5 VAE",
                "this decode expects the released decoder's per-pixel RMS norms",
                "decode this VAE on one device (vae.decode)",
            )
    return BandLayers(tuple(convs), (), tuple(attentions))


def attention(block: nn.Module, x: torch.Tensor, attend: Attend) -> torch.Tensor:
    """HunyuanVideo15AttnBlock on a band: RMS norm (per pixel), 1x1x1 q/k/v, attention over every band, output."""
    hidden = block.norm(x)
    q, k, v = block.to_q(hidden), block.to_k(hidden), block.to_v(hidden)
    return block.proj_out(attend(q, k, v, 1, None)) + x


VIDEO_VAE = VideoVae(
    vae_class="AutoencoderKLHunyuanVideo15",
    layers=band_layers,
    decode=lambda vae, z: vae.decoder(z),
    latent_channels=lambda vae: int(vae.config.latent_channels),
    spatial_factor=lambda vae: int(vae.config.spatial_compression_ratio),
    output_frames=lambda latent_frames: 1 + 4 * (latent_frames - 1),
    causal_attention=lambda vae: True,
)
