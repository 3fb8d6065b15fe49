"""HunyuanVideo 1.0's VAE (diffusers ``AutoencoderKLHunyuanVideo``) as the band-parallel video decode sees it.

The decoder is causal 3-D convs (3x3x3 padded by replicating edges, 1x1x1 shortcuts), GroupNorms over the whole
clip, nearest upsampling (the first frame spatially only) and one mid-block attention over every pixel of every
frame. diffusers masks that attention frame-causally, as Tencent's code does; ComfyUI's HunyuanVideo VAE attends
to all frames. A VAE read from a ComfyUI-layout file (``vae_file``) is decoded as ComfyUI does, one from a
diffusers folder as diffusers does. The clip is decoded whole: diffusers' ``vae.decode`` cuts clips of more
than 4 latent frames into overlapping time tiles and blends them (a memory saving the row bands make instead),
ComfyUI decodes whole unless it runs out of memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...video_vae import Attend, BandLayers, CausalConv, VideoVae

COMFY_ATTENTION = "dit_parallel_comfy_attention"  # set on a VAE read from a ComfyUI file: non-causal attention
_FIX = "decode this VAE on one device (vae.decode), or use the HunyuanVideo VAE as published"


def _unsupported(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"the parallel HunyuanVideo VAE decode cannot split {where}: {what}",
        "each rank decodes a band of rows: exact for stride-1 causal convs, GroupNorm, nearest upsampling and the "
        "mid-block attention, which are swapped for band versions",
        _FIX,
    )


def band_layers(vae: nn.Module) -> BandLayers:
    """The decoder's causal convs, GroupNorms and mid blocks; raises for a layer a band decode would get wrong."""
    causal_class, mid_class = compat.hunyuan_video_vae_layer_classes()
    convs, norms, attentions, inner = [], [], [], set()
    for name, module in vae.decoder.named_modules():
        where = f"decoder.{name}"
        if isinstance(module, causal_class):
            conv = module.conv
            if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.padding != (0, 0, 0):
                raise _unsupported(where, f"stride {conv.stride}, dilation {conv.dilation}, padding {conv.padding}")
            convs.append(CausalConv(module, conv, tuple(module.time_causal_padding), module.pad_mode))
            inner.add(id(conv))
        elif isinstance(module, nn.GroupNorm):
            norms.append(module)
        elif isinstance(module, mid_class):
            attentions.append((module, mid_block))
        elif isinstance(module, (nn.Conv2d, nn.Conv3d)) and id(module) not in inner and max(module.kernel_size) > 1:
            raise _unsupported(where, f"{type(module).__name__} kernel {module.kernel_size}")
    return BandLayers(tuple(convs), tuple(norms), tuple(attentions))


def mid_block(block: nn.Module, x: torch.Tensor, attend: Attend) -> torch.Tensor:
    """HunyuanVideoMidBlock3D on a band [B, C, T, rows, W]: resnet, (attention, resnet)..."""
    x = block.resnets[0](x)
    for attn, resnet in zip(block.attentions, block.resnets[1:]):
        if attn is not None:
            x = _attention(attn, x, attend)
        x = resnet(x)
    return x


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return F.linear(x.movedim(1, -1), layer.weight, layer.bias).movedim(-1, 1)


def _attention(attn: nn.Module, x: torch.Tensor, attend: Attend) -> torch.Tensor:
    """diffusers' Attention over the pixels (GroupNorm, q/k/v, output projection, residual) with the pixels of
    every band as keys."""
    hidden = attn.group_norm(x) if attn.group_norm is not None else x
    q, k, v = (_linear(hidden, layer) for layer in (attn.to_q, attn.to_k, attn.to_v))
    out = _linear(attend(q, k, v, attn.heads, attn.scale), attn.to_out[0])
    if attn.residual_connection:
        out = out + x
    return out / attn.rescale_output_factor


def decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The decoder on ``z`` (VAE space), whole: no spatial or temporal tiles."""
    return vae.decoder(vae.post_quant_conv(z))


def causal_attention(vae: nn.Module) -> bool:
    return not getattr(vae, COMFY_ATTENTION, False)


VIDEO_VAE = VideoVae(
    vae_class="AutoencoderKLHunyuanVideo",
    layers=band_layers,
    decode=decode,
    latent_channels=lambda vae: int(vae.config.latent_channels),
    spatial_factor=lambda vae: int(vae.config.spatial_compression_ratio),
    output_frames=lambda latent_frames: 1 + 4 * (latent_frames - 1),
    causal_attention=causal_attention,
)
