"""Qwen2.5-VL's vision tower, read from the same ComfyUI text-encoder file as the text model (``visual.*``), and
the image -> vision-token path that Qwen-Image-Edit's prompts use.

The tower is transformers' ``Qwen2_5_VisionTransformerPretrainedModel``: its sizes come from the header, the rest
(16 heads, full attention in blocks 7/15/23/31, 112-pixel windows) from Qwen2.5-VL-7B's config. fp8 files keep
their Linear layers in fp8 as the text model does.

Pixels: the image is resized to the nearest multiples of 28 (14-pixel patches merged 2x2; bilinear, as ComfyUI's
Qwen-Image text encoder does it, not Qwen's PIL bicubic processor), normalised with CLIP's mean / std, each patch
repeated over Qwen2.5-VL's two video frames, the patches listed 2x2 block by 2x2 block. The merged tokens come
back in the tower's WINDOW order (112-pixel windows, raster inside each), which is the order ComfyUI's tower
returns them in; transformers' model puts them back in raster order (equal when the image is one window).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ConfigError
from ...prefixed_text_file import load_prefixed_model

VISION_PREFIX = "visual."
QWEN25_VL_7B_VISION: Mapping[str, Any] = {  # what the weights do not show
    "num_heads": 16,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "window_size": 112,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
}
PATCH = 14
MERGE = 2
FRAMES = 2  # Qwen2.5-VL's temporal patch: an image is two identical frames
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 16384
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def has_vision_tower(shapes: Mapping[str, Any]) -> bool:
    return VISION_PREFIX + "patch_embed.proj.weight" in shapes


def qwen25_vision_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The vision config of a ComfyUI Qwen2.5-VL file, from its header (``overrides``: e.g. a head count)."""
    if not has_vision_tower(shapes):
        raise ConfigError(
            "the text-encoder file has no vision tower (no visual.patch_embed.proj.weight)",
            "a Qwen-Image-Edit prompt with images runs them through Qwen2.5-VL's vision tower",
            "pick a qwen_2.5_vl_7b*.safetensors that holds visual.* (ComfyUI's own files do), or leave out the images",
        )
    base = {**QWEN25_VL_7B_VISION, **(overrides or {})}
    p = VISION_PREFIX
    return {
        **base,
        "hidden_size": shapes[p + "patch_embed.proj.weight"][0],
        "depth": len({k.split(".")[2] for k in shapes if k.startswith(p + "blocks.")}),
        "intermediate_size": shapes[p + "blocks.0.mlp.gate_proj.weight"][0],
        "out_hidden_size": shapes[p + "merger.mlp.2.weight"][0],
        "in_channels": 3,
    }


def load_qwen25_vision_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The vision tower in ComfyUI's Qwen2.5-VL file ``path`` (see the module doc), on ``device``."""
    from transformers import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    if str(path).lower().endswith(".gguf"):
        raise ConfigError(
            f"images with a GGUF text encoder ({Path(path).name})",
            "llama.cpp's Qwen2.5-VL GGUF files hold the text model only (the vision tower is a separate mmproj)",
            "encode Qwen-Image-Edit prompts with images from qwen_2.5_vl_7b*.safetensors",
        )

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        config = Qwen2_5_VLVisionConfig(**qwen25_vision_config(shapes, overrides))
        return Qwen2_5_VisionTransformerPretrainedModel(config)

    return load_prefixed_model(path, VISION_PREFIX, build, device, dtype, storage, what="of the vision tower")


def vision_input_size(height: int, width: int) -> tuple[int, int]:
    """(height, width) the tower sees: each side rounded to a multiple of 28, the area kept within
    [MIN_PIXELS, MAX_PIXELS] (the sides scaled together, down to / up from the nearest multiples)."""
    unit = PATCH * MERGE
    h, w = round(height / unit) * unit, round(width / unit) * unit
    if h * w > MAX_PIXELS:
        shrink = math.sqrt(height * width / MAX_PIXELS)
        h = max(unit, math.floor(height / shrink / unit) * unit)
        w = max(unit, math.floor(width / shrink / unit) * unit)
    elif h * w < MIN_PIXELS:
        grow = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * grow / unit) * unit, math.ceil(width * grow / unit) * unit
    return h, w


def image_patches(image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """An image ([H, W, C] in [0, 1], C >= 3) as the tower's input rows and its patch grid (1, rows, columns):
    one row per 14x14 patch, 2x2 blocks of patches in raster order, each row (channel, frame, y, x)."""
    h, w = vision_input_size(image.shape[0], image.shape[1])
    pixels = image[..., :3].movedim(-1, 0).unsqueeze(0).float()
    pixels = F.interpolate(pixels, size=(h, w), mode="bilinear", align_corners=False)[0]
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    pixels = (pixels - mean) / std
    gh, gw = h // PATCH, w // PATCH
    # (c, block row, row in block, y, block column, column in block, x) -> blocks, then patches in a block
    grid = pixels.reshape(3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    grid = grid.permute(1, 4, 2, 5, 0, 3, 6).unsqueeze(-3)  # (..., c, frame, y, x)
    grid = grid.expand(*grid.shape[:-3], FRAMES, PATCH, PATCH)
    return grid.reshape(gh * gw, 3 * FRAMES * PATCH * PATCH), (1, gh, gw)


def window_order(merged_rows: int, merged_cols: int, window: int) -> torch.Tensor:
    """Indices of the merged tokens (raster order) listed window by window (``window`` tokens a side; windows in
    raster order, tokens in raster order inside each)."""
    index = torch.arange(merged_rows * merged_cols).reshape(merged_rows, merged_cols)
    order = []
    for top in range(0, merged_rows, window):
        for left in range(0, merged_cols, window):
            order.append(index[top : top + window, left : left + window].reshape(-1))
    return torch.cat(order)


@torch.no_grad()
def vision_tokens(tower: nn.Module, image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The tower's tokens for ``image`` ([H, W, C]) in its window order, and the merged grid (rows, columns)."""
    weight = tower.patch_embed.proj.weight  # a conv: in the model's dtype in fp8 files too
    rows, (t, gh, gw) = image_patches(image)
    grid = torch.tensor([[t, gh, gw]], device=weight.device)
    merged = tower(rows.to(weight.device, weight.dtype), grid_thw=grid).pooler_output  # raster order
    config = tower.config
    window = config.window_size // config.spatial_merge_size // config.patch_size
    order = window_order(gh // MERGE, gw // MERGE, window).to(merged.device)
    return merged[order], (gh // MERGE, gw // MERGE)
