"""The diffusers AutoencoderKL decoder, run band by band with the ops of :mod:`.ops`.

Walks the model's own submodules (post_quant_conv, decoder.conv_in, mid_block resnets and
attentions, up_blocks resnets and upsamplers, conv_norm_out, conv_act, conv_out) in the order of
``Decoder.forward`` and reads their weights; nothing global is patched. :func:`check_decoder`
first verifies that the model only uses layers these ops reproduce exactly (the SD / SDXL / SD3 /
Flux / PixArt VAEs do) and says which layer does not otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from ..errors import ConfigError
from .bands import RowBands
from .ops import band_attention, band_conv2d, band_group_norm, band_upsample_nearest2x

_FIX = (
    "decode this VAE on one device (vae.decode), or use an AutoencoderKL whose decoder is built from "
    "UpDecoderBlock2D blocks with GroupNorm (the SD, SDXL, SD3, Flux and PixArt VAEs are)"
)


def _unsupported(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"the parallel VAE decode cannot split {where}: {what}",
        "each rank decodes a band of rows, which is exact only for stride-1 'same' convolutions, GroupNorm, "
        "nearest 2x upsampling and the mid-block self-attention",
        _FIX,
    )


def _check_conv(conv: nn.Module, where: str) -> None:
    if not isinstance(conv, nn.Conv2d):
        raise _unsupported(where, f"expected a Conv2d, found {type(conv).__name__}")
    kh, _ = conv.kernel_size
    if isinstance(conv.padding, str):
        raise _unsupported(where, f"padding={conv.padding!r} given as a string")
    if conv.stride != (1, 1) or conv.dilation != (1, 1):
        raise _unsupported(where, f"stride {conv.stride} / dilation {conv.dilation} (only 1 is supported)")
    if kh != 2 * conv.padding[0] + 1 or conv.padding_mode != "zeros":
        raise _unsupported(where, f"kernel {conv.kernel_size} with padding {conv.padding} ({conv.padding_mode})")


def _check_norm(norm: nn.Module, where: str) -> None:
    if not isinstance(norm, nn.GroupNorm):
        raise _unsupported(where, f"normalisation {type(norm).__name__} (only GroupNorm is supported)")


def _upsample_conv(upsampler: nn.Module) -> nn.Module | None:
    """The conv after the interpolation of a diffusers Upsample2D (named ``conv`` or ``Conv2d_0``)."""
    if not getattr(upsampler, "use_conv", False):
        return None
    return upsampler.conv if getattr(upsampler, "name", "conv") == "conv" else upsampler.Conv2d_0


def _check_resnet(resnet: nn.Module, where: str) -> None:
    for attr in ("norm1", "conv1", "norm2", "conv2", "nonlinearity"):
        if not hasattr(resnet, attr):
            raise _unsupported(where, f"{type(resnet).__name__} has no {attr} (expected a ResnetBlock2D)")
    # The decoder passes no time embedding: then "default"/"group" resnets are plain norm-conv blocks.
    if getattr(resnet, "time_emb_proj", None) is not None or getattr(resnet, "time_embedding_norm", "default") in (
        "scale_shift",
        "ada_group",
        "spatial",
    ):
        raise _unsupported(where, "a resnet conditioned on a time embedding")
    if getattr(resnet, "upsample", None) is not None or getattr(resnet, "downsample", None) is not None:
        raise _unsupported(where, "a resnet that resamples")
    _check_norm(resnet.norm1, f"{where}.norm1")
    _check_norm(resnet.norm2, f"{where}.norm2")
    _check_conv(resnet.conv1, f"{where}.conv1")
    _check_conv(resnet.conv2, f"{where}.conv2")
    if resnet.conv_shortcut is not None:
        _check_conv(resnet.conv_shortcut, f"{where}.conv_shortcut")


def _check_attention(attn: nn.Module, where: str) -> None:
    for attr in ("to_q", "to_k", "to_v", "to_out", "heads", "scale"):
        if not hasattr(attn, attr):
            raise _unsupported(where, f"{type(attn).__name__} has no {attr} (expected a diffusers Attention)")
    for attr in ("spatial_norm", "norm_q", "norm_k", "norm_cross"):
        if getattr(attn, attr, None) is not None:
            raise _unsupported(where, f"attention with {attr}")
    if attn.group_norm is not None:
        _check_norm(attn.group_norm, f"{where}.group_norm")


def _decoder_layers(vae: nn.Module) -> Iterator[tuple[str, str, nn.Module, int]]:
    """(kind, name, module, upsampling factor so far) for every layer the walk visits, in order.
    Kinds: conv, norm, resnet, attention, upsampler."""
    decoder = vae.decoder
    scale = 1
    if getattr(vae, "post_quant_conv", None) is not None:
        yield "conv", "post_quant_conv", vae.post_quant_conv, scale
    yield "conv", "decoder.conv_in", decoder.conv_in, scale
    mid = decoder.mid_block
    for i, resnet in enumerate(mid.resnets):
        yield "resnet", f"decoder.mid_block.resnets.{i}", resnet, scale
    for i, attn in enumerate(mid.attentions):
        if attn is not None:
            yield "attention", f"decoder.mid_block.attentions.{i}", attn, scale
    for b, block in enumerate(decoder.up_blocks):
        for i, resnet in enumerate(block.resnets):
            yield "resnet", f"decoder.up_blocks.{b}.resnets.{i}", resnet, scale
        for i, up in enumerate(block.upsamplers or []):
            scale *= 2
            yield "upsampler", f"decoder.up_blocks.{b}.upsamplers.{i}", up, scale
    yield "norm", "decoder.conv_norm_out", decoder.conv_norm_out, scale
    yield "conv", "decoder.conv_out", decoder.conv_out, scale


def check_decoder(vae: nn.Module) -> int:
    """Verify that ``vae``'s decode can be split into row bands exactly.

    Returns the fewest latent rows a band needs so that every conv's halo fits inside one
    neighbouring band (1 for the usual 3x3 convs). Raises ConfigError naming the first layer
    that cannot be split."""
    decoder = getattr(vae, "decoder", None)
    if decoder is None or not all(
        hasattr(decoder, a) for a in ("conv_in", "mid_block", "up_blocks", "conv_norm_out", "conv_act", "conv_out")
    ):
        raise ConfigError(
            f"{type(vae).__name__} has no diffusers-style decoder (conv_in, mid_block, up_blocks, conv_out)",
            "the parallel decode walks the layers of diffusers' AutoencoderKL decoder",
            "pass a diffusers AutoencoderKL",
        )
    if vae.training:
        raise ConfigError(
            "the VAE is in training mode",
            "decoding is inference; dropout would make the bands disagree with a single-device decode",
            "call vae.eval() before decoding",
        )
    need = 1
    for kind, name, module, scale in _decoder_layers(vae):
        convs: list[tuple[str, nn.Module]] = []
        if kind == "conv":
            convs.append((name, module))
        elif kind == "norm":
            _check_norm(module, name)
        elif kind == "resnet":
            _check_resnet(module, name)
            convs += [(f"{name}.conv1", module.conv1), (f"{name}.conv2", module.conv2)]
        elif kind == "attention":
            _check_attention(module, name)
        elif kind == "upsampler":
            if (
                getattr(module, "use_conv_transpose", False)
                or not getattr(module, "interpolate", True)
                or getattr(module, "norm", None) is not None
            ):
                raise _unsupported(name, "an upsampler other than nearest 2x interpolation + conv")
            conv = _upsample_conv(module)
            if conv is not None:
                convs.append((f"{name}.conv", conv))
        for conv_name, conv in convs:
            _check_conv(conv, conv_name)
            need = max(need, math.ceil(conv.padding[0] / scale))
    for b, block in enumerate(decoder.up_blocks):
        if getattr(block, "attentions", None) is not None:
            raise _unsupported(f"decoder.up_blocks.{b}", f"{type(block).__name__} has attention layers")
    return need


def _resnet(x: torch.Tensor, resnet: nn.Module, layout: RowBands) -> torch.Tensor:
    """A diffusers ResnetBlock2D without time embedding (as in every VAE decoder)."""
    hidden = resnet.nonlinearity(band_group_norm(x, resnet.norm1, layout))
    hidden = band_conv2d(hidden, resnet.conv1, layout)
    hidden = resnet.nonlinearity(band_group_norm(hidden, resnet.norm2, layout))
    hidden = band_conv2d(hidden, resnet.conv2, layout)
    shortcut = x if resnet.conv_shortcut is None else band_conv2d(x, resnet.conv_shortcut, layout)
    return (shortcut + hidden) / resnet.output_scale_factor


def decode_band(vae: nn.Module, z_band: torch.Tensor, layout: RowBands) -> torch.Tensor:
    """Decode this rank's latent band (rows ``layout.offset`` onward) to its image band.

    Every rank of ``layout.group`` must call this together (ranks with 0 rows too). Returns
    [B, out_channels, rows * f, W * f] where f is the decoder's upsampling factor."""
    x = z_band
    if getattr(vae, "post_quant_conv", None) is not None:
        x = band_conv2d(x, vae.post_quant_conv, layout)
    decoder = vae.decoder
    x = band_conv2d(x, decoder.conv_in, layout)
    mid = decoder.mid_block
    x = _resnet(x, mid.resnets[0], layout)
    for attn, resnet in zip(mid.attentions, mid.resnets[1:]):
        if attn is not None:
            x = band_attention(x, attn, layout)
        x = _resnet(x, resnet, layout)
    for block in decoder.up_blocks:
        for resnet in block.resnets:
            x = _resnet(x, resnet, layout)
        for upsampler in block.upsamplers or []:
            x, layout = band_upsample_nearest2x(x, layout)
            conv = _upsample_conv(upsampler)
            if conv is not None:
                x = band_conv2d(x, conv, layout)
    x = decoder.conv_act(band_group_norm(x, decoder.conv_norm_out, layout))
    return band_conv2d(x, decoder.conv_out, layout)


def upsampling_factor(vae: nn.Module) -> int:
    """How many image pixels one latent pixel becomes along each side (8 for the usual VAEs)."""
    return max(scale for _, _, _, scale in _decoder_layers(vae))
