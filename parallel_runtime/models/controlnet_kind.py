"""What the host knows of a ControlNet file (``controlnet_files.describe_controlnet`` makes it; a family's
ControlNet module fills it for the layouts it reads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .latent_formats import LatentFormat

FLUX_INSTANTX = "instantx-union"
FLUX_XLABS = "xlabs"
FLUX_MISTOLINE = "mistoline"
QWEN_INSTANTX = "qwen-instantx"
QWEN_DIFFSYNTH = "qwen-diffsynth"  # a DiffSynth model patch (models/model_patches), not a ControlNet file


@dataclasses.dataclass(frozen=True)
class ControlNetFile:
    """What the host knows of a ControlNet file before any worker loads it."""

    path: str
    kind: str  # FLUX_INSTANTX (Flux's InstantX / Union layout), FLUX_XLABS, FLUX_MISTOLINE, QWEN_INSTANTX ...
    family: str  # the model family it controls
    union_modes: int  # a union file's control types (0: not a union file)
    hint_channels: int  # channels of the hint the ControlNet reads (the encoded latent's, or 3 for an image)
    double_blocks: int  # a Qwen-Image ControlNet's (dual-stream) blocks count here
    single_blocks: int
    hint_format: LatentFormat | None  # the hint's VAE latent -> model space (``latent_format.process_in``);
    # None: the hint is the IMAGE itself, scaled to ``pixel_scale`` x the latent (no VAE)
    pixel_scale: int = 8
    mask_channels: int = 0  # an inpainting ControlNet's mask channels, after the encoded hint's (in hint_channels)

    @property
    def hint_scale(self) -> int:
        """The hint's size over the latent's: 1 for a VAE latent, ``pixel_scale`` for an image."""
        return 1 if self.hint_format is not None else self.pixel_scale

    @property
    def name(self) -> str:
        return Path(self.path).name
