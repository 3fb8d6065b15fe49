"""SD3's latent format and preview factors: ComfyUI 0.3.64's ``latent_formats.SD3`` (16 channels)."""

from __future__ import annotations

from ...latent_formats import LatentFormat
from ..spec import LatentPreview

SCALE, SHIFT = 1.5305, 0.0609


def latent_format(channels: int) -> LatentFormat:
    """SD3's scale and shift for a latent of ``channels`` (16 for SD3 and SD3.5)."""
    return LatentFormat(channels, SCALE, SHIFT)


SD3_PREVIEW = LatentPreview(
    "SD3",
    (
        (-0.0922, -0.0175, 0.0749), (0.0311, 0.0633, 0.0954), (0.1994, 0.0927, 0.0458), (0.0856, 0.0339, 0.0902),
        (0.0587, 0.0272, -0.0496), (-0.0006, 0.1104, 0.0309), (0.0978, 0.0306, 0.0427), (-0.0042, 0.1038, 0.1358),
        (-0.0194, 0.0020, 0.0669), (-0.0488, 0.0130, -0.0268), (0.0922, 0.0988, 0.0951), (-0.0278, 0.0524, -0.0542),
        (0.0332, 0.0456, 0.0895), (-0.0069, -0.0030, -0.0810), (-0.0596, -0.0465, -0.0293), (-0.1448, -0.1463, -0.1189),
    ),
    (0.2394, 0.2135, 0.1925),
)  # fmt: skip
