"""Wan VAE files (``models/vae/wan_2.1_vae.safetensors``, ``wan2.2_vae.safetensors``) as diffusers
``AutoencoderKLWan``, read offline.

The original (Wan / ComfyUI) names are ``decoder.middle.0.residual.0.gamma``, ``decoder.upsamples.N...``.
Wan 2.1's layout is converted by diffusers' own ``convert_wan_vae_to_diffusers``; diffusers has no
single-file converter for Wan 2.2's (residual up/down blocks: ``decoder.upsamples.B.upsamples.J``), so
:func:`wan22_to_diffusers` renames it with the table below. Widths, latent channels and the 2x2 pixel
patch of Wan 2.2 are read from the tensor shapes; what a file does not record — the per-channel latent
statistics — are ComfyUI's Wan21 / Wan22 values (``latent.py``). ``vae.file`` finds the format through the
registry (``FamilySpec.vae_file``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ... import compat
from ..spec import VaeFileFormat
from .latent import WAN21, WAN22

MARKER = "decoder.middle.0.residual.0.gamma"
WAN22_MARKER = "decoder.upsamples.0.upsamples.0.residual.2.weight"
_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2": "conv1", "residual.3.gamma": "norm2.gamma",
             "residual.6": "conv2", "shortcut": "conv_shortcut"}  # fmt: skip
_TOP = {"conv1.": "quant_conv.", "conv2.": "post_quant_conv."}
_SIDE = {"conv1.": "conv_in.", "head.0.gamma": "norm_out.gamma", "head.2.": "conv_out."}
_LEVEL = re.compile(r"(encoder|decoder)\.(downsamples|upsamples)\.(\d+)\.(downsamples|upsamples)\.(\d+)\.(.+)")


def is_wan_vae_file(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> bool:
    return prefix + MARKER in shapes


def wan_vae_config(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The AutoencoderKLWan config of an original-layout Wan VAE, from its tensor shapes."""
    wan22 = WAN22_MARKER in shapes
    z_dim = shapes["conv2.weight"][0]
    in_channels = shapes["encoder.conv1.weight"][1] if "encoder.conv1.weight" in shapes else 3
    patch = 2 if wan22 and in_channels == 12 else None
    decoder_width = shapes["decoder.conv1.weight"][0]  # the decoder's first width: base width x 4
    fmt = WAN22 if z_dim == WAN22.channels else WAN21
    if z_dim != fmt.channels:
        raise ConfigError(
            f"a Wan VAE with {z_dim} latent channels",
            "the published Wan VAEs have 16 (Wan 2.1) or 48 (Wan 2.2) channels; their latent statistics are known",
            "use the Wan 2.1 or Wan 2.2 VAE file",
        )
    config = {
        "base_dim": shapes["encoder.conv1.weight"][0] if "encoder.conv1.weight" in shapes else decoder_width // 4,
        "decoder_base_dim": decoder_width // 4,
        "z_dim": z_dim,
        "is_residual": wan22,
        "in_channels": in_channels,
        "out_channels": shapes["decoder.head.2.weight"][0],
        "patch_size": patch,
        "scale_factor_spatial": 8 * (patch or 1),
        "scale_factor_temporal": 4,
        "latents_mean": list(fmt.mean),
        "latents_std": list(fmt.std),
    }
    return config


def _resnet(tail: str) -> str | None:
    for old, name in _RESIDUAL.items():
        if tail.startswith(old):
            return name + tail[len(old) :]
    return None


def _rename_wan22(key: str) -> str | None:
    for old, name in _TOP.items():
        if key.startswith(old):
            return name + key[len(old) :]
    level = _LEVEL.fullmatch(key)
    if level:
        side, outer, block, _, inner, tail = level.groups()
        blocks = "down_blocks" if outer == "downsamples" else "up_blocks"
        if tail.startswith(("resample.", "time_conv.")):
            return f"{side}.{blocks}.{block}.{'downsampler' if outer == 'downsamples' else 'upsampler'}.{tail}"
        resnet = _resnet(tail)
        return None if resnet is None else f"{side}.{blocks}.{block}.resnets.{inner}.{resnet}"
    side, _, rest = key.partition(".")
    if side not in ("encoder", "decoder"):
        return None
    if rest.startswith("middle.1."):
        return f"{side}.mid_block.attentions.0.{rest[len('middle.1.') :]}"
    for old, index in (("middle.0.", 0), ("middle.2.", 1)):
        if rest.startswith(old):
            resnet = _resnet(rest[len(old) :])
            return None if resnet is None else f"{side}.mid_block.resnets.{index}.{resnet}"
    for old, name in _SIDE.items():
        if rest.startswith(old):
            return f"{side}.{name}{rest[len(old) :]}"
    return None


def wan22_to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Wan 2.2 VAE names -> AutoencoderKLWan (is_residual) names."""
    out = {}
    for key, value in state.items():
        new = _rename_wan22(key)
        if new is None:
            raise ConfigError(
                f"unknown tensor {key!r} in a Wan 2.2 VAE file",
                "the file's VAE has parts the Wan 2.2 VAE does not",
                "use the Wan 2.2 VAE file published with the model (wan2.2_vae.safetensors)",
            )
        out[new] = value
    return out


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An original-layout Wan 2.1 or 2.2 VAE state dict in AutoencoderKLWan names."""
    return wan22_to_diffusers(state) if config["is_residual"] else compat.convert_wan_vae(state)


def build_wan_vae(state: dict[str, torch.Tensor], config: Mapping[str, Any], name: str):
    """An AutoencoderKLWan holding ``state`` (original layout), its parameters never materialised randomly."""
    from diffusers import AutoencoderKLWan

    from ...weights import parameters_on_meta

    converted = to_diffusers(state, config)
    with parameters_on_meta():
        vae = AutoencoderKLWan(**config)
    expected = set(vae.state_dict())
    missing, unexpected = sorted(expected - set(converted)), sorted(set(converted) - expected)
    wrong = [k for k in expected & set(converted) if converted[k].shape != vae.state_dict()[k].shape]
    if missing or unexpected or wrong:
        raise ConfigError(
            f"{name} does not fit a Wan VAE: missing {missing[:3]}, unknown {unexpected[:3]}, shapes {wrong[:3]}",
            "the structure read from the tensor shapes does not match every tensor (a partial or modified VAE)",
            "use the Wan VAE file published with the model",
        )
    vae.load_state_dict(converted, strict=True, assign=True)
    return vae


FORMAT = VaeFileFormat(is_wan_vae_file, wan_vae_config, build_wan_vae)
