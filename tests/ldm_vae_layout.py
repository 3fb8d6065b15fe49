"""diffusers AutoencoderKL names -> the original LDM names, for building VAE test files (ours)."""

from __future__ import annotations

import re

import torch


def to_ldm(state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """diffusers AutoencoderKL names -> the original LDM names (ours, for building test files)."""
    out = {}
    for key, value in state.items():
        k = key
        k = re.sub(r"^(encoder|decoder)\.mid_block\.resnets\.(\d)", lambda m: f"{m[1]}.mid.block_{int(m[2]) + 1}", k)
        for src, dst in (("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")):
            if ".mid_block.attentions.0." + src + "." in k:
                k = k.replace(".mid_block.attentions.0." + src + ".", ".mid.attn_1." + dst + ".")
                if value.ndim == 2:
                    value = value[:, :, None, None]  # LDM stores the projections as 1x1 convs
        k = re.sub(r"^encoder\.down_blocks\.(\d)\.resnets\.", r"encoder.down.\1.block.", k)
        k = re.sub(r"^encoder\.down_blocks\.(\d)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", k)
        k = re.sub(r"^decoder\.up_blocks\.(\d)\.resnets\.", lambda m: f"decoder.up.{levels - 1 - int(m[1])}.block.", k)
        k = re.sub(
            r"^decoder\.up_blocks\.(\d)\.upsamplers\.0\.", lambda m: f"decoder.up.{levels - 1 - int(m[1])}.upsample.", k
        )
        k = k.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
        out[k] = value.contiguous()
    return out
