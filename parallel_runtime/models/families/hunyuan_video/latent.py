"""HunyuanVideo 1.0's latent format and preview factors: ComfyUI 0.3.64's ``latent_formats.HunyuanVideo``
(16 channels, one scale for every channel, no shift; diffusers' ``AutoencoderKLHunyuanVideo`` records the same
``scaling_factor``)."""

from __future__ import annotations

from ...latent_formats import LatentFormat
from ..spec import LatentPreview

SCALE = 0.476986

HUNYUAN_VIDEO = LatentFormat(channels=16, scale=SCALE)

HUNYUAN_VIDEO_PREVIEW = LatentPreview(
    "HunyuanVideo",
    (
        (-0.0395, -0.0331, 0.0445), (0.0696, 0.0795, 0.0518), (0.0135, -0.0945, -0.0282), (0.0108, -0.0250, -0.0765),
        (-0.0209, 0.0032, 0.0224), (-0.0804, -0.0254, -0.0639), (-0.0991, 0.0271, -0.0669), (-0.0646, -0.0422, -0.0400),
        (-0.0696, -0.0595, -0.0894), (-0.0799, -0.0208, -0.0375), (0.1166, 0.1627, 0.0962), (0.1165, 0.0432, 0.0407),
        (-0.2315, -0.1920, -0.1355), (-0.0270, 0.0401, -0.0821), (-0.0616, -0.0997, -0.0727), (0.0249, -0.0469, -0.1703),
    ),
    (0.0259, -0.0192, -0.0761),
)  # fmt: skip
