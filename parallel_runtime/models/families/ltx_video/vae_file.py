"""LTX-Video VAEs in Lightricks' layout: the ``vae.`` part of an ``ltx-video-2b-v0.9.safetensors`` checkpoint (what
ComfyUI's CheckpointLoaderSimple reads as the VAE), read as diffusers' ``AutoencoderKLLTXVideo``.

The 0.9.0 layout numbers the decoder's pieces ``up_blocks.0`` (the mid block) to ``up_blocks.9`` (resnets,
depth-to-space upsamplers and the channel-changing resnets in a fixed order) and the encoder's ``down_blocks.0``
to ``.9``; widths, resnets per level, latent channels and the pixel patch come from the tensor shapes, the renaming
is diffusers' own single-file converter's. The decoder pads in space as ComfyUI's VAE Decode pads it: reflect,
unless the checkpoint's ``config`` metadata states a ``spatial_padding_mode`` (zeros; diffusers' decoder pads with
zeros). The later layouts (0.9.1+: a timestep-conditioned decoder) are read by
``vae_file_later`` (the decoder only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ... import compat
from ..spec import VaeFileFormat
from . import vae_file_later

MARKER = "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight"  # ComfyUI's LTX VAE marker too
LATER = "decoder.last_time_embedder.timestep_embedder.linear_1.weight"  # 0.9.1+: decode timestep
DECODER_LEVELS, ENCODER_LEVELS = (1, 3, 6, 9), (0, 3, 6, 8)  # the resnet pieces of each level (0.9.0 layout)
Shapes = Mapping[str, tuple[int, ...]]


def matches(shapes: Shapes, prefix: str = "") -> bool:
    return prefix + MARKER in shapes


def _resnets(shapes: Shapes, piece: str) -> int:
    count = 0
    while f"{piece}.res_blocks.{count}.conv1.conv.weight" in shapes:
        count += 1
    return count


def _width(shapes: Shapes, piece: str) -> int:
    return shapes[f"{piece}.res_blocks.0.conv1.conv.weight"][0]


def vae_config(shapes: Shapes) -> dict[str, Any]:
    """The AutoencoderKLLTXVideo config of a Lightricks-layout VAE (0.9.0; 0.9.1+: ``vae_file_later``), from its
    tensor shapes."""
    if LATER in shapes:
        return vae_file_later.vae_config(shapes)
    pieces = (
        "decoder.up_blocks.9.res_blocks.0.conv1.conv.weight",
        "encoder.down_blocks.9.res_blocks.0.conv1.conv.weight",
    )
    if any(piece not in shapes for piece in pieces):
        raise ConfigError(
            "an LTX-Video VAE in an unknown Lightricks layout (neither 0.9.0's pieces nor a decode timestep)",
            "the 0.9.0 layout and the timestep-conditioned 0.9.1+ decoders are read from single files",
            "decode the LATENT with ComfyUI's VAE Decode (the VAE of CheckpointLoaderSimple on this file), and load "
            "the transformer with a VAE file of a known layout or none",
        )
    decoder = [_width(shapes, f"decoder.up_blocks.{i}") for i in DECODER_LEVELS]
    encoder = [_width(shapes, f"encoder.down_blocks.{i}") for i in ENCODER_LEVELS]
    patch = math.isqrt(shapes["encoder.conv_in.conv.weight"][1] // 3)
    return {
        "latent_channels": shapes["decoder.conv_in.conv.weight"][1],
        "block_out_channels": tuple(encoder),
        "decoder_block_out_channels": tuple(reversed(decoder)),
        "layers_per_block": tuple(_resnets(shapes, f"encoder.down_blocks.{i}") for i in (*ENCODER_LEVELS, 9)),
        "decoder_layers_per_block": tuple(
            reversed([_resnets(shapes, f"decoder.up_blocks.{i}") for i in (0, *DECODER_LEVELS)])
        ),
        "patch_size": patch,
        vae_file_later.PADDING: "reflect",  # ComfyUI's decoder pads so unless the checkpoint's metadata says otherwise
    }


def build(state: dict[str, torch.Tensor], config: dict[str, Any], name: str) -> torch.nn.Module:
    from diffusers import AutoencoderKLLTXVideo

    from ...weights import parameters_on_meta

    if vae_file_later.is_later(config):
        return vae_file_later.build(state, config, name)
    config = dict(config)
    padding = config.pop(vae_file_later.PADDING, "zeros")
    converted = compat.convert_ltx_vae({"vae." + k: v for k, v in state.items()})
    with parameters_on_meta():
        vae = AutoencoderKLLTXVideo(**config)
    expected = set(vae.state_dict())
    missing, unexpected = sorted(expected - set(converted)), sorted(set(converted) - expected)
    if missing or unexpected:
        raise ConfigError(
            f"{name}: an LTX-Video VAE whose tensors do not fit the 0.9.0 layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            "the VAE is read with diffusers' converter of Lightricks' names and a config from its shapes",
            "decode the LATENT with ComfyUI's VAE Decode (the VAE of CheckpointLoaderSimple on this file)",
        )
    vae.load_state_dict(converted, strict=True, assign=True)
    vae_file_later.pad_decoder(vae, padding)  # the encoder keeps zeros, as in ComfyUI
    return vae


FORMAT = VaeFileFormat(matches=matches, config=vae_config, build=build, metadata=vae_file_later.with_metadata)
