"""What the host knows of a ControlNet file (``controlnet_files.describe_controlnet`` makes it; a family's
ControlNet module fills it for the layouts it reads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .latent_formats import LatentFormat

FLUX_INSTANTX = "instantx-union"


@dataclasses.dataclass(frozen=True)
class ControlNetFile:
    """What the host knows of a ControlNet file before any worker loads it."""

    path: str
    kind: str  # FLUX_INSTANTX (Flux's InstantX / Union layout)
    family: str  # the model family it controls
    union_modes: int  # a union file's control types (0: not a union file)
    hint_channels: int  # latent channels of the encoded hint
    double_blocks: int
    single_blocks: int
    hint_format: LatentFormat  # the hint's VAE latent -> model space (ComfyUI's ``latent_format.process_in``)

    @property
    def name(self) -> str:
        return Path(self.path).name
