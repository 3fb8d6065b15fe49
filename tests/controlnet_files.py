"""Tiny ControlNet files in the layouts ComfyUI 0.3.64 detects, built from their module classes with
deterministic weights (per tensor name), at the widths of the tiny reference Flux (tests/data/comfy_ref_flux_dev:
hidden 64, 16-wide heads, rope axes 4/6/6, text 32, pooled 24, guidance input).

``python tests/controlnet_files.py`` rewrites the stored files under tests/data (the ComfyUI reference generator
reads them from there); tests/test_controlnet_flux.py checks the stored file is what this builds.
"""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data"
FLUX_UNION = DATA / "tiny_flux_controlnet_union.safetensors"
FLUX_UNION_CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 24,
    "guidance_embeds": True,
    "axes_dims_rope": [4, 6, 6],
    "num_mode": 10,
}


def _value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    t = torch.randn(shape, generator=g)
    if name.endswith("norm_q.weight") or name.endswith("norm_k.weight"):
        return 1.0 + 0.1 * t  # RMS-norm scales
    if len(shape) == 1:
        return 0.02 * t
    scale = 1.0 if "embedder.weight" in name and "mode" in name else 1.0 / math.sqrt(math.prod(shape[1:]))
    return t * scale


def flux_union_state() -> dict[str, torch.Tensor]:
    """The tiny Flux Union ControlNet (diffusers' FluxControlNetModel names), stored as fp16."""
    from diffusers.models.controlnets.controlnet_flux import FluxControlNetModel

    with torch.device("meta"):
        model = FluxControlNetModel(**FLUX_UNION_CONFIG)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return {k: _value(k, s).to(torch.float16).contiguous() for k, s in sorted(shapes.items())}


def write_flux_union(path: Path = FLUX_UNION) -> Path:
    from safetensors.torch import save_file

    save_file(flux_union_state(), str(path))
    return path


if __name__ == "__main__":
    sys.exit(print(write_flux_union()))
