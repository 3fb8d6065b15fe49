"""Parallel Empty Latent: an empty LATENT with the model's channel count and a valid size."""

from __future__ import annotations

from typing import Any

from parallel_runtime.errors import ConfigError

from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY

MAX_RESOLUTION = 16384
SIZE_STEP = 8  # the VAE's factor, as ComfyUI's EmptyLatentImage; the model pads to its patch size when it can


def check_size(width: int, height: int) -> None:
    """Raise ConfigError unless both sides are multiples of 8 pixels from 16 up (EmptyLatentImage's
    rule); whether the model takes sizes that are not a multiple of its patch is checked with it."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value % SIZE_STEP:
            lower = max(16, (int(value) // SIZE_STEP) * SIZE_STEP) if isinstance(value, (int, float)) else 1024
            raise ConfigError(
                f"{name} {value!r} is not a multiple of {SIZE_STEP} (from 16)",
                f"the VAE shrinks the image {SIZE_STEP}x, so each side is a whole number of latent pixels",
                f"use {name} {lower} or {lower + SIZE_STEP}",
            )


class ParallelEmptyLatent:
    """Zeros [batch, model latent channels, height/8, width/8] (video models: [batch, channels,
    (length-1)/4+1, height/f, width/f], as EmptyHunyuanLatentVideo / Wan22ImageToVideoLatent make them)."""

    DESCRIPTION = (
        "Creates an empty latent with the channel count of the parallel model (16 for Flux/SD3/Wan 2.1, 4 for "
        "PixArt, 48 for Wan 2.2 TI2V-5B); for a video model, length frames."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("Empty latent for Parallel Sampler (denoise 1.0).",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        size = {"min": 16, "max": MAX_RESOLUTION, "step": SIZE_STEP}
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "Decides the latent channel count."}),
                "width": (
                    "INT",
                    {
                        "default": 1024,
                        **size,
                        "tooltip": "Image width in pixels (multiple of 8; PixArt and PipeFusion layouts need 16).",
                    },
                ),
                "height": (
                    "INT",
                    {
                        "default": 1024,
                        **size,
                        "tooltip": "Image height in pixels (multiple of 8; PixArt and PipeFusion layouts need 16).",
                    },
                ),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Images per run."}),
            },
            "optional": {
                "length": (
                    "INT",
                    {
                        "default": 1,
                        "min": 1,
                        "max": MAX_RESOLUTION,
                        "step": 4,
                        "tooltip": "Video frames (video models; 4k+1, e.g. 81 for Wan). Image models take 1.",
                    },
                ),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, width: int, height: int) -> bool | str:
        """Sizes must be multiples of 8 from 16 (ComfyUI range-checks batch_size itself: it is not named here)."""
        try:
            check_size(width, height)
        except ConfigError as exc:
            return str(exc)
        if width > MAX_RESOLUTION or height > MAX_RESOLUTION:
            return f"{width}x{height} is larger than {MAX_RESOLUTION} pixels on a side"
        return True

    def generate(
        self, parallel_model: ParallelModelHandle, width: int, height: int, batch_size: int, length: int = 1
    ) -> tuple[dict]:
        import torch

        check_size(width, height)
        model = parallel_model.model()
        channels, f = model.latent_channels, getattr(model, "spatial_factor", 8)
        if width % f or height % f:
            raise ConfigError(
                f"{width}x{height} px is not a multiple of {f} px for {model.family}",
                f"this model's VAE shrinks the image {f}x, so each side is a whole number of latent pixels",
                f"use {max(f, width // f * f)}x{max(f, height // f * f)}",
            )
        if model.latent_dims == 3:
            step = model.patch_pixels  # video models do not pad to the patch here (yet): whole tokens
            if width % step or height % step:
                raise ConfigError(
                    f"{width}x{height} for a {model.family} model whose tokens are {step}x{step} pixels",
                    f"its VAE shrinks the image {f}x and the transformer packs 2x2 latent pixels into one token",
                    f"use multiples of {step}, e.g. {width // step * step or step}x{height // step * step or step}",
                )
            model.check_latent_size(height // f, width // f)
            frames = (int(length) - 1) // model.temporal_factor + 1
            return ({"samples": torch.zeros(batch_size, channels, frames, height // f, width // f)},)
        model.check_latent_size(height // f, width // f)
        if length != 1:
            raise ConfigError(
                f"length {length} for the {model.family} image model",
                "length counts video frames; an image model makes one image per batch item",
                "set length to 1 (or load a video model such as Wan)",
            )
        samples = torch.zeros(batch_size, channels, height // f, width // f)
        if getattr(model, "latent_frame_axis", False):  # Qwen-Image's LATENT, as ComfyUI keeps it: [B, C, 1, H, W]
            samples = samples.unsqueeze(2)
        return ({"samples": samples},)
