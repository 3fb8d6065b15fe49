"""Flux.1's latent format and preview factors: ComfyUI 0.3.64's ``latent_formats.Flux`` (16 channels)."""

from __future__ import annotations

from ...latent_formats import LatentFormat
from ..spec import LatentPreview

SCALE, SHIFT = 0.3611, 0.1159


def latent_format(channels: int) -> LatentFormat:
    """Flux's scale and shift for a latent of ``channels`` (16 for every published Flux.1)."""
    return LatentFormat(channels, SCALE, SHIFT)


FLUX_PREVIEW = LatentPreview(
    "Flux",
    (
        (-0.0346, 0.0244, 0.0681), (0.0034, 0.0210, 0.0687), (0.0275, -0.0668, -0.0433), (-0.0174, 0.0160, 0.0617),
        (0.0859, 0.0721, 0.0329), (0.0004, 0.0383, 0.0115), (0.0405, 0.0861, 0.0915), (-0.0236, -0.0185, -0.0259),
        (-0.0245, 0.0250, 0.1180), (0.1008, 0.0755, -0.0421), (-0.0515, 0.0201, 0.0011), (0.0428, -0.0012, -0.0036),
        (0.0817, 0.0765, 0.0749), (-0.1264, -0.0522, -0.1103), (-0.0280, -0.0881, -0.0499), (-0.1262, -0.0982, -0.0778),
    ),
    (-0.0329, -0.0718, -0.0851),
)  # fmt: skip
