"""HunyuanVideo 1.5 VAE files in Tencent's layout, as Comfy-Org repackages them
(``models/vae/hunyuanvideo15_vae_fp16.safetensors``): ``encoder.down.N.block.M.conv1.conv``,
``decoder.up.N.upsample.conv.conv``, ``decoder.mid.attn_1.q``, per-pixel RMS norms as ``*.gamma``; read as diffusers'
``AutoencoderKLHunyuanVideo15``.

The renaming is the one diffusers' ``scripts/convert_hunyuan_video1_5_to_diffusers.py`` applies (levels keep their
numbers on both sides, the attention's 1x1x1 convs stay convs). Widths, depth, blocks per level, latent channels and
both compressions come from the tensor shapes: an upsampler's conv widens to 4x its output (space) or 8x (space and
time). The scaling factor is the release's (1.03682, its diffusers config).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ..spec import VaeFileFormat

MARKER = "decoder.mid.block_1.conv1.conv.weight"  # the 3-D (causal conv) layout of an LDM-style decoder
RMS_NORM = "decoder.norm_out.gamma"  # per-pixel RMS norms (HunyuanVideo 1.0's file has GroupNorms: norm_out.weight)
SCALING_FACTOR = 1.03682
FIX = "use the HunyuanVideo 1.5 VAE file as published (hunyuanvideo15_vae_fp16.safetensors)"
_LEVEL = re.compile(r"(encoder\.down|decoder\.up)\.(\d+)\.(block\.(\d+)|downsample|upsample)\.(.+)")
_MID = {"mid.block_1.": "mid_block.resnets.0.", "mid.block_2.": "mid_block.resnets.1.", "mid.attn_1.": None}
_ATTENTION = {"norm.": "norm.", "q.": "to_q.", "k.": "to_k.", "v.": "to_v.", "proj_out.": "proj_out."}
_SHORTCUT = ("nin_shortcut.", "conv_shortcut.")


def matches(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> bool:
    return prefix + MARKER in shapes and prefix + RMS_NORM in shapes


def _count(shapes: Mapping[str, tuple[int, ...]], pattern: str) -> int:
    n = 0
    while pattern.format(n) in shapes:
        n += 1
    return n


def vae_config(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The AutoencoderKLHunyuanVideo15 config of a Tencent-layout HunyuanVideo 1.5 VAE, from its tensor shapes."""
    levels = _count(shapes, "decoder.up.{}.block.0.conv1.conv.weight")
    blocks = _count(shapes, "decoder.up.0.block.{}.conv1.conv.weight")
    if levels < 2 or blocks < 2:
        raise ConfigError(
            f"a HunyuanVideo 1.5 VAE with {levels} decoder levels and {blocks} blocks per level",
            "its decoder has a level per 2x upsampling plus one, each with one block more than the encoder's",
            FIX,
        )
    widths = [shapes[f"decoder.up.{i}.block.0.conv2.conv.weight"][0] for i in range(levels)]  # latent side first
    spatial = temporal = 1
    for i in range(levels - 1):
        key = f"decoder.up.{i}.upsample.conv.conv.weight"
        if key in shapes:
            factor = shapes[key][0] // widths[i + 1]
            spatial, temporal = spatial * 2, temporal * (2 if factor == 8 else 1)
    return {
        "in_channels": shapes["encoder.conv_in.conv.weight"][1] if "encoder.conv_in.conv.weight" in shapes else 3,
        "out_channels": shapes["decoder.conv_out.conv.weight"][0],
        "latent_channels": shapes["decoder.conv_in.conv.weight"][1],
        "block_out_channels": list(reversed(widths)),
        "layers_per_block": blocks - 1,
        "spatial_compression_ratio": spatial,
        "temporal_compression_ratio": temporal,
        "scaling_factor": SCALING_FACTOR,
    }


def diffusers_name(key: str) -> str | None:
    """A Tencent-layout VAE tensor name -> its AutoencoderKLHunyuanVideo15 name (None: not a part of this VAE)."""
    level = _LEVEL.fullmatch(key)
    if level:
        side, index, part, block, tail = level.groups()
        out = f"{'decoder.up_blocks' if side == 'decoder.up' else 'encoder.down_blocks'}.{index}"
        if block is not None:
            return f"{out}.resnets.{block}.{tail.replace(*_SHORTCUT)}"
        return f"{out}.{'upsamplers' if part == 'upsample' else 'downsamplers'}.0.{tail}"
    side, _, rest = key.partition(".")
    if side not in ("encoder", "decoder"):
        return None
    for old, new in _MID.items():
        if rest.startswith(old):
            tail = rest[len(old) :]
            if new is not None:
                return f"{side}.{new}{tail.replace(*_SHORTCUT)}"
            for o, n in _ATTENTION.items():
                if tail.startswith(o):
                    return f"{side}.mid_block.attentions.0.{n}{tail[len(o) :]}"
            return None
    if rest.startswith(("conv_in.", "conv_out.", "norm_out.")):
        return key
    return None


def to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tencent-layout VAE names -> AutoencoderKLHunyuanVideo15 names (same tensors)."""
    out = {}
    for key, value in state.items():
        name = diffusers_name(key)
        if name is None:
            raise ConfigError(
                f"unknown tensor {key!r} in a HunyuanVideo 1.5 VAE file",
                "the file's VAE has parts the HunyuanVideo 1.5 VAE does not",
                FIX,
            )
        out[name] = value
    return out


def build(state: dict[str, torch.Tensor], config: dict[str, Any], name: str):
    """An AutoencoderKLHunyuanVideo15 holding ``state``."""
    from diffusers import AutoencoderKLHunyuanVideo15

    from ...weights import parameters_on_meta

    converted = to_diffusers(state)
    with parameters_on_meta():
        vae = AutoencoderKLHunyuanVideo15(**config)
    expected = vae.state_dict()
    missing, unexpected = sorted(set(expected) - set(converted)), sorted(set(converted) - set(expected))
    wrong = [k for k in set(expected) & set(converted) if converted[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ConfigError(
            f"{name} does not fit a HunyuanVideo 1.5 VAE: missing {missing[:3]}, unknown {unexpected[:3]}, "
            f"shapes {wrong[:3]}",
            "the structure read from the tensor shapes does not match every tensor (a partial or modified VAE)",
            FIX,
        )
    vae.load_state_dict(converted, strict=True, assign=True)
    return vae


FORMAT = VaeFileFormat(matches, vae_config, build)
