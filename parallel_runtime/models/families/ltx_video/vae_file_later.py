"""LTX-Video VAEs in Lightricks' later layout (0.9.1+: a timestep-conditioned decoder), read as diffusers'
``AutoencoderKLLTXVideo`` for decoding.

The decoder's pieces are numbered from the latent side: ``up_blocks.0`` (resnets), then an upsampler
(``compress_all``: a conv to ``8 * width / factor`` channels and a 2x2x2 depth-to-space) and resnets in turn. Widths,
resnets per piece, injected noise (``per_channel_scale1``, 0.9.1) and the upsamplers' channel factors come from the
tensor shapes. What the weights do not record is read as ComfyUI reads it: from the checkpoint's ``config`` metadata
(``vae``: its ``decoder_blocks``' ``residual`` flags, ``spatial_padding_mode``, ``causal_decoder``) when the VAE
sits in a checkpoint (Load Checkpoint), else ComfyUI's assumption for such a file (residual upsamplers, reflect
padding in the decoder, not causal). Only the decoder and the latent statistics are loaded: the engine only decodes,
and the encoders of the later releases differ (an encoder in the file is left unread).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat

Shapes = Mapping[str, tuple[int, ...]]
SCALE_MULTIPLIER = "decoder.timestep_scale_multiplier"
PADDING = "decoder_spatial_padding_mode"  # ours: set on the decoder's convs after building (diffusers has no key)
_FIX = "decode the LATENT with ComfyUI's VAE Decode (the VAE of CheckpointLoaderSimple / VAELoader on this file)"


class NoEncoder(nn.Module):
    """Stands for the encoder a later-layout VAE is loaded without (the engine only decodes)."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise ConfigError(
            "encoding with an LTX-Video 0.9.1+ VAE read from a single file",
            "only its decoder is loaded: the parallel runtime decodes, ComfyUI's nodes encode",
            "encode with ComfyUI's VAE Encode / LTXVImgToVideo on the VAE of CheckpointLoaderSimple",
        )


def _piece(shapes: Shapes, i: int) -> str | None:
    """ "res" (resnets), "up" (an upsampler) or None for decoder.up_blocks.<i>."""
    if f"decoder.up_blocks.{i}.res_blocks.0.conv1.conv.weight" in shapes:
        return "res"
    if f"decoder.up_blocks.{i}.conv.conv.weight" in shapes:
        return "up"
    return None


def _refuse(what: str) -> ConfigError:
    return ConfigError(
        f"an LTX-Video 0.9.1+ VAE decoder with {what}",
        "the later layout is read as alternating resnets and 2x2x2 depth-to-space upsamplers (compress_all), as "
        "ComfyUI reads the 0.9.1 and 0.9.5 VAEs",
        _FIX,
    )


def vae_config(shapes: Shapes) -> dict[str, Any]:
    """The AutoencoderKLLTXVideo config of a later-layout decoder, from its tensor shapes (ComfyUI's assumptions
    for what they do not record: see ``with_metadata``)."""
    for needed in ("decoder.conv_in.conv.weight", "decoder.conv_out.conv.weight"):
        if needed not in shapes:
            raise _refuse(f"no {needed}")
    kinds = []
    while (kind := _piece(shapes, len(kinds))) is not None:
        kinds.append(kind)
    if not kinds or kinds[::2] != ["res"] * len(kinds[::2]) or kinds[1::2] != ["up"] * len(kinds[1::2]):
        raise _refuse(f"pieces {kinds} (not resnets and upsamplers in turn, from resnets)")
    if kinds[-1] != "res":
        raise _refuse("an upsampler last")
    res = [f"decoder.up_blocks.{i}" for i in range(0, len(kinds), 2)]
    ups = [f"decoder.up_blocks.{i}.conv.conv.weight" for i in range(1, len(kinds), 2)]
    counts = []
    for piece in res:
        count = 0
        while f"{piece}.res_blocks.{count}.conv1.conv.weight" in shapes:
            count += 1
        counts.append(count)
    widths = [shapes[f"{piece}.res_blocks.0.conv1.conv.weight"][0] for piece in res]
    factors = []
    for k, up in enumerate(ups):
        out_channels, in_channels = shapes[up][:2]
        factor = 8 * in_channels // out_channels
        if in_channels != widths[k] or factor * out_channels != 8 * in_channels or out_channels // 8 != widths[k + 1]:
            raise _refuse(f"an upsampler {in_channels} -> {out_channels} channels between widths {widths[k : k + 2]}")
        factors.append(factor)
    injected = [f"{piece}.res_blocks.0.per_channel_scale1" in shapes for piece in res]
    patch = math.isqrt(shapes["decoder.conv_out.conv.weight"][0] // 3)
    levels = len(ups)
    return {
        "latent_channels": shapes["decoder.conv_in.conv.weight"][1],
        "decoder_block_out_channels": tuple(reversed(widths[:-1])),
        "decoder_layers_per_block": tuple(reversed(counts)),
        "decoder_spatio_temporal_scaling": (True,) * levels,
        "decoder_inject_noise": tuple(reversed(injected)),
        "upsample_residual": (True,) * levels,
        "upsample_factor": tuple(reversed(factors)),
        "timestep_conditioning": SCALE_MULTIPLIER in shapes,
        "patch_size": patch,
        "decoder_causal": False,
        "spatial_compression_ratio": patch * 2**levels,
        "temporal_compression_ratio": 2**levels,
        PADDING: "reflect",
    }


def is_later(config: Mapping[str, Any]) -> bool:
    return "upsample_factor" in config  # 0.9.0's config (``vae_file``) has fixed depth-to-space upsamplers


def with_padding(config: dict[str, Any], vae: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the decoder's spatial padding a checkpoint's ``vae`` metadata states (ComfyUI: reflect
    when it states none)."""
    config = dict(config)
    config[PADDING] = vae.get("spatial_padding_mode", "reflect")
    if config[PADDING] not in ("zeros", "reflect"):
        raise _refuse(f"spatial_padding_mode {config[PADDING]!r} (the band decode pads with zeros or reflect)")
    return config


def pad_decoder(vae: nn.Module, padding: str) -> None:
    """Set the spatial padding of every conv of ``vae``'s decoder (diffusers' config has no key for it)."""
    for module in vae.decoder.modules():
        if isinstance(module, nn.Conv3d):
            module.padding_mode = padding


def with_metadata(config: dict[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
    """``config`` with what a checkpoint's ``config`` metadata states of its VAE (ComfyUI's Load Checkpoint builds
    the VAE from it): the upsamplers' ``residual`` flags, the decoder's spatial padding and causality."""
    if "config" not in metadata:
        return config
    try:
        vae = json.loads(metadata["config"]).get("vae") or {}
    except (ValueError, AttributeError):
        return config
    config = with_padding(config, vae)
    if not is_later(config):
        return config
    config["decoder_causal"] = bool(vae.get("causal_decoder", False))
    blocks = vae.get("decoder_blocks", vae.get("blocks"))
    if blocks is not None:
        ups = [params for name, params in blocks if name not in ("res_x",)]
        if any(name not in ("res_x", "compress_all") for name, _ in blocks) or len(ups) != len(
            config["upsample_factor"]
        ):
            raise _refuse(f"the blocks {[name for name, _ in blocks]} its metadata states")
        residual = [bool(p.get("residual", False)) if isinstance(p, dict) else False for p in ups]
        config["upsample_residual"] = tuple(residual)  # the metadata lists them from the pixel side
    return config


def build(state: dict[str, torch.Tensor], config: dict[str, Any], name: str) -> nn.Module:
    """The decoder and latent statistics of ``state`` in an AutoencoderKLLTXVideo (its encoder: ``NoEncoder``)."""
    from diffusers import AutoencoderKLLTXVideo

    from ...weights import parameters_on_meta

    config = dict(config)
    padding = config.pop(PADDING)
    kept = {k: v for k, v in state.items() if k.startswith(("decoder.", "per_channel_statistics."))}
    probe = "vae.encoder.conv_out.conv.weight"  # diffusers' converter reads it to tell 0.9.5's names: not 2048 wide
    converted = compat.convert_ltx_vae({"vae." + k: v for k, v in kept.items()} | {probe: torch.zeros(1, 1)})
    converted.pop("encoder.conv_out.conv.weight")
    with parameters_on_meta():
        vae = AutoencoderKLLTXVideo(**config)
    vae.encoder = NoEncoder()
    expected = set(vae.state_dict())
    missing, unexpected = sorted(expected - set(converted)), sorted(set(converted) - expected)
    if missing or unexpected:
        raise ConfigError(
            f"{name}: an LTX-Video 0.9.1+ VAE whose tensors do not fit the layout read from its shapes "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            "the decoder is read with diffusers' converter of Lightricks' names and a config from its shapes",
            _FIX,
        )
    vae.load_state_dict(converted, strict=True, assign=True)
    pad_decoder(vae, padding)
    return vae
