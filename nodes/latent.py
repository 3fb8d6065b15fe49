"""Parallel Empty Latent: an empty LATENT with the model's channel count and a valid size."""

from __future__ import annotations

from typing import Any

from parallel_runtime.errors import ConfigError

from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY

MAX_RESOLUTION = 16384
SIZE_STEP = 16  # VAE factor 8 x transformer patch 2: one token per 16x16 pixels


def check_size(width: int, height: int) -> None:
    """Raise ConfigError unless both sides are positive multiples of 16 pixels."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < SIZE_STEP or value % SIZE_STEP:
            lower = max(SIZE_STEP, (int(value) // SIZE_STEP) * SIZE_STEP) if isinstance(value, (int, float)) else 1024
            raise ConfigError(
                f"{name} {value!r} is not a multiple of {SIZE_STEP}",
                "the VAE shrinks the image 8x and the transformer packs 2x2 latent pixels into one token, "
                f"so each side must be a multiple of {SIZE_STEP} pixels",
                f"use {name} {lower} or {lower + SIZE_STEP}",
            )


class ParallelEmptyLatent:
    """Zeros [batch, model latent channels, height/8, width/8]: the start of text-to-image."""

    DESCRIPTION = (
        "Creates an empty latent with the channel count of the parallel model (16 for Flux/SD3, 4 for PixArt)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("Empty latent for Parallel Sampler (denoise 1.0).",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        size = {"min": SIZE_STEP, "max": MAX_RESOLUTION, "step": SIZE_STEP}
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "Decides the latent channel count."}),
                "width": ("INT", {"default": 1024, **size, "tooltip": "Image width in pixels (multiple of 16)."}),
                "height": ("INT", {"default": 1024, **size, "tooltip": "Image height in pixels (multiple of 16)."}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Images per run."}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, width: int, height: int) -> bool | str:
        """Sizes must be multiples of 16 (ComfyUI range-checks batch_size itself: it is not named here)."""
        try:
            check_size(width, height)
        except ConfigError as exc:
            return str(exc)
        if width > MAX_RESOLUTION or height > MAX_RESOLUTION:
            return f"{width}x{height} is larger than {MAX_RESOLUTION} pixels on a side"
        return True

    def generate(self, parallel_model: ParallelModelHandle, width: int, height: int, batch_size: int) -> tuple[dict]:
        import torch

        check_size(width, height)
        model = parallel_model.model()
        f = getattr(model, "spatial_factor", 8)
        samples = torch.zeros(batch_size, model.latent_channels, height // f, width // f)
        if getattr(model, "latent_frame_axis", False):  # Qwen-Image's LATENT, as ComfyUI keeps it: [B, C, 1, H, W]
            samples = samples.unsqueeze(2)
        return ({"samples": samples},)
