"""HunyuanVideo 1.0 VAE files as ComfyUI keeps them (``models/vae/hunyuan_video_vae_bf16.safetensors``): ComfyUI's
own layout (``decoder.up.N.block.M.conv1.conv``, ``decoder.mid.attn_1.q``...), read as diffusers'
``AutoencoderKLHunyuanVideo`` and marked to decode as ComfyUI decodes it (``vae_bands.COMFY_ATTENTION``).

Widths, depth, blocks per level and latent channels come from the tensor shapes; the GroupNorm group count (32)
and the 4x temporal compression are what ComfyUI builds for such a file. The renaming is written from the two
layouts' names (diffusers has no single-file converter for this VAE); the attention's 1x1x1 conv weights
become linear ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ....errors import ConfigError
from ..spec import VaeFileFormat
from .vae_bands import COMFY_ATTENTION

MARKER = "decoder.mid.block_1.conv1.conv.weight"  # ComfyUI's 3-D (video) layout of an LDM decoder
NORM_GROUPS = 32  # ComfyUI's Normalize
_LEVEL = re.compile(r"(encoder\.down|decoder\.up)\.(\d+)\.(block\.(\d+)|downsample|upsample)\.(.+)")
_RESNET = {"nin_shortcut.": "conv_shortcut."}
_ATTENTION = {"norm.": "group_norm.", "q.": "to_q.", "k.": "to_k.", "v.": "to_v.", "proj_out.": "to_out.0."}


def matches(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> bool:
    key = prefix + "decoder.conv_in.conv.weight"
    return prefix + MARKER in shapes and key in shapes and len(shapes[key]) == 5 and shapes[key][1] == 16


def _levels(shapes: Mapping[str, tuple[int, ...]]) -> int:
    levels = 0
    while f"decoder.up.{levels}.block.0.conv1.conv.weight" in shapes:
        levels += 1
    return levels


def vae_config(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The AutoencoderKLHunyuanVideo config of a ComfyUI-layout HunyuanVideo VAE, from its tensor shapes."""
    levels = _levels(shapes)
    blocks = 0
    while f"decoder.up.0.block.{blocks}.conv1.conv.weight" in shapes:
        blocks += 1
    upsamples = sum(f"decoder.up.{i}.upsample.conv.conv.weight" in shapes for i in range(levels))
    if levels < 3 or blocks < 1:
        raise ConfigError(
            f"a HunyuanVideo VAE with {levels} levels and {blocks} blocks per level",
            "the video VAE has a level per 2x upsampling plus one, with 4x temporal compression over two of them",
            "use the HunyuanVideo VAE file as published (hunyuan_video_vae_bf16.safetensors)",
        )
    return {
        "in_channels": shapes["encoder.conv_in.conv.weight"][1] if "encoder.conv_in.conv.weight" in shapes else 3,
        "out_channels": shapes["decoder.conv_out.conv.weight"][0],
        "latent_channels": shapes["decoder.conv_in.conv.weight"][1],
        "down_block_types": ["HunyuanVideoDownBlock3D"] * levels,
        "up_block_types": ["HunyuanVideoUpBlock3D"] * levels,
        "block_out_channels": [
            shapes[f"decoder.up.{i}.block.{blocks - 1}.conv2.conv.weight"][0] for i in range(levels)
        ],
        "layers_per_block": blocks - 1,
        "norm_num_groups": NORM_GROUPS,
        "scaling_factor": 0.476986,
        "spatial_compression_ratio": 2**upsamples,
        "temporal_compression_ratio": 4,
        "mid_block_add_attention": "decoder.mid.attn_1.q.weight" in shapes,
    }


def _rename(key: str, levels: int) -> str | None:
    if key.startswith(("quant_conv.", "post_quant_conv.")):
        return key
    level = _LEVEL.fullmatch(key)
    if level:
        side, index, part, block, tail = level.groups()
        if side == "decoder.up":
            out = f"decoder.up_blocks.{levels - 1 - int(index)}"
        else:
            out = f"encoder.down_blocks.{index}"
        if block is not None:
            for old, new in _RESNET.items():
                tail = tail.replace(old, new)
            return f"{out}.resnets.{block}.{tail}"
        return f"{out}.{'upsamplers' if part == 'upsample' else 'downsamplers'}.0.{tail}"
    side, _, rest = key.partition(".")
    if side not in ("encoder", "decoder"):
        return None
    for old, index in (("mid.block_1.", 0), ("mid.block_2.", 1)):
        if rest.startswith(old):
            tail = rest[len(old) :]
            for o, n in _RESNET.items():
                tail = tail.replace(o, n)
            return f"{side}.mid_block.resnets.{index}.{tail}"
    if rest.startswith("mid.attn_1."):
        tail = rest[len("mid.attn_1.") :]
        for old, new in _ATTENTION.items():
            if tail.startswith(old):
                return f"{side}.mid_block.attentions.0.{new}{tail[len(old) :]}"
        return None
    for old, new in (("norm_out.", "conv_norm_out."), ("conv_in.", "conv_in."), ("conv_out.", "conv_out.")):
        if rest.startswith(old):
            return f"{side}.{new}{rest[len(old) :]}"
    return None


def to_diffusers(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """ComfyUI-layout VAE names -> AutoencoderKLHunyuanVideo names."""
    levels = len(config["block_out_channels"])
    out = {}
    for key, value in state.items():
        name = _rename(key, levels)
        if name is None:
            raise ConfigError(
                f"unknown tensor {key!r} in a HunyuanVideo VAE file",
                "the file's VAE has parts the HunyuanVideo VAE does not",
                "use the HunyuanVideo VAE file as published (hunyuan_video_vae_bf16.safetensors)",
            )
        if ".attentions.0.to_" in name and name.endswith(".weight") and value.ndim == 5:
            value = value.flatten(1)  # a 1x1x1 conv -> a linear layer
        out[name] = value
    return out


def build(state: dict[str, torch.Tensor], config: dict[str, Any], name: str):
    """An AutoencoderKLHunyuanVideo holding ``state``, decoded as ComfyUI decodes this file."""
    from diffusers import AutoencoderKLHunyuanVideo

    from ...weights import parameters_on_meta

    converted = to_diffusers(state, config)
    with parameters_on_meta():
        vae = AutoencoderKLHunyuanVideo(**config)
    expected = vae.state_dict()
    missing, unexpected = sorted(set(expected) - set(converted)), sorted(set(converted) - set(expected))
    wrong = [k for k in set(expected) & set(converted) if converted[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ConfigError(
            f"{name} does not fit a HunyuanVideo VAE: missing {missing[:3]}, unknown {unexpected[:3]}, shapes {wrong[:3]}",
            "the structure read from the tensor shapes does not match every tensor (a partial or modified VAE)",
            "use the HunyuanVideo VAE file as published (hunyuan_video_vae_bf16.safetensors)",
        )
    vae.load_state_dict(converted, strict=True, assign=True)
    setattr(vae, COMFY_ATTENTION, True)
    return vae


FORMAT = VaeFileFormat(matches, vae_config, build)
