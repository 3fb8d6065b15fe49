"""LTX-2's video VAE in Lightricks' layout: the ``vae.`` part of ``ltx-2-19b-dev.safetensors`` (the release's
checkpoint) or the same tensors alone in ``models/vae``, read as diffusers' ``AutoencoderKLLTX2Video`` for decoding.

Lightricks number the decoder's pieces from the latent side: ``up_blocks.0`` (the mid block's resnets), then an
upsampler (``up_blocks.1``: a conv to ``8 x width / factor`` channels and a 2x2x2 depth-to-space) and resnets
(``up_blocks.2``) in turn, three times; resnets are ``res_blocks``, the latent statistics
``per_channel_statistics.mean-of-means`` / ``std-of-means`` (diffusers' ``latents_mean`` / ``latents_std``). The
renames are diffusers' single-file converter's (``convert_ltx2_vae_to_diffusers``, the tests' oracle). Widths,
resnets per piece, upsampling factors, latent channels and the pixel patch come from the tensor shapes; what they do
not show is the release's: spatio-temporal upsamplers with residuals, a decoder that is not causal and pads in
space by reflection. Only the decoder and the statistics are loaded (the engine only decodes); a decoder with
noise injection or a decode timestep (LTX-Video 0.9.1+'s, not LTX-2's) is not this layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ..spec import VaeFileFormat

Shapes = Mapping[str, tuple[int, ...]]
MID = "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight"
STATISTICS = ("per_channel_statistics.mean-of-means", "per_channel_statistics.std-of-means")
UPSAMPLERS = (1, 3, 5)  # then resnets at 2, 4, 6
DEPTH_TO_SPACE = 8  # 2x2x2
RENAMES = (  # Lightricks' decoder pieces -> diffusers'
    ("decoder.up_blocks.0.", "decoder.mid_block."),
    ("decoder.up_blocks.1.", "decoder.up_blocks.0.upsamplers.0."),
    ("decoder.up_blocks.2.", "decoder.up_blocks.0."),
    ("decoder.up_blocks.3.", "decoder.up_blocks.1.upsamplers.0."),
    ("decoder.up_blocks.4.", "decoder.up_blocks.1."),
    ("decoder.up_blocks.5.", "decoder.up_blocks.2.upsamplers.0."),
    ("decoder.up_blocks.6.", "decoder.up_blocks.2."),
)
_FIX = "use the LTX-2 VAE as Lightricks publish it (ltx-2-19b-dev.safetensors' vae), or the diffusers folder's"


def matches(shapes: Shapes, prefix: str = "") -> bool:
    """An LTX-2 decoder: the mid block's resnets, three upsampler / resnet pairs and nothing after, no decode
    timestep or injected noise, and the latent statistics."""
    local = {k[len(prefix) :] for k in shapes if k.startswith(prefix)}
    pieces = all(f"decoder.up_blocks.{i}.conv.conv.weight" in local for i in UPSAMPLERS)
    later = any(k.startswith(("decoder.up_blocks.7.", "decoder.last_time_embedder.")) for k in local)
    noise = any("per_channel_scale" in k for k in local)
    return MID in local and pieces and not later and not noise and all(s in local for s in STATISTICS)


def _count(shapes: Shapes, piece: str) -> int:
    n = 0
    while f"decoder.up_blocks.{piece}.res_blocks.{n}.conv1.conv.weight" in shapes:
        n += 1
    return n


def vae_config(shapes: Shapes) -> dict[str, Any]:
    """The AutoencoderKLLTX2Video decoder config of a Lightricks-layout LTX-2 VAE, from its tensor shapes."""
    width = shapes["decoder.conv_in.conv.weight"][0]
    widths, factors = [], []
    for up in UPSAMPLERS:
        out = shapes[f"decoder.up_blocks.{up}.conv.conv.weight"][0]
        factor, rest = divmod(DEPTH_TO_SPACE * width, out)
        resnet = shapes[f"decoder.up_blocks.{up + 1}.res_blocks.0.conv1.conv.weight"][0]
        if rest or factor < 1:
            raise ConfigError(f"an LTX-2 VAE whose upsampler {up} maps {width} to {out} channels",
                              "the layout is read as 2x2x2 depth-to-space upsamplers", _FIX)  # fmt: skip
        widths.append(resnet * factor)
        factors.append(factor)
        width = resnet
    patch = math.isqrt(shapes["decoder.conv_out.conv.weight"][0] // 3)
    return {
        "latent_channels": shapes["decoder.conv_in.conv.weight"][1],
        "decoder_block_out_channels": tuple(reversed(widths)),
        "decoder_layers_per_block": tuple(reversed([_count(shapes, str(i)) for i in (0, 2, 4, 6)])),
        "upsample_factor": tuple(reversed(factors)),
        "patch_size": patch,
        "decoder_causal": False,  # the release's decoder (not in the weights)
        "decoder_spatial_padding_mode": "reflect",
        "spatial_compression_ratio": patch * 2 ** len(UPSAMPLERS),
        "temporal_compression_ratio": 2 ** len(UPSAMPLERS),
    }


def to_diffusers_name(name: str) -> str:
    for original, diffusers in RENAMES:
        if name.startswith(original):
            name = diffusers + name[len(original) :]
            break
    return name.replace(".res_blocks.", ".resnets.")


class NoEncoder(nn.Module):
    """Stands for the encoder a VAE read from Lightricks' file is loaded without (the engine only decodes)."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise ConfigError(
            "encoding with an LTX-2 VAE read from a single file",
            "only its decoder is loaded: the parallel runtime decodes",
            "encode with the diffusers folder's VAE",
        )


def build(state: dict[str, torch.Tensor], config: dict[str, Any], name: str) -> nn.Module:
    from diffusers import AutoencoderKLLTX2Video

    from ...weights import parameters_on_meta

    with parameters_on_meta():
        vae = AutoencoderKLLTX2Video(block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1), **config)
    vae.encoder = NoEncoder()  # a stand-in (the encoder above is a small placeholder on meta)
    mean, std = (state.pop(k) for k in STATISTICS)
    decoder = {to_diffusers_name(k): v for k, v in state.items() if k.startswith("decoder.")}
    expected = set(vae.decoder.state_dict(prefix="decoder."))
    missing, unexpected = sorted(expected - set(decoder)), sorted(set(decoder) - expected)
    if missing or unexpected:
        raise ConfigError(
            f"{name}: an LTX-2 VAE whose decoder tensors do not fit its layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            "the decoder is read with Lightricks' names and a config from its shapes",
            _FIX,
        )
    vae.load_state_dict({**decoder, "latents_mean": mean, "latents_std": std}, strict=False, assign=True)
    return vae


FORMAT = VaeFileFormat(matches=matches, config=vae_config, build=build)
