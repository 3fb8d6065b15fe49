"""What LTX-Video adds to the shared Conditioning: the video's frame rate (``models.frame_rate``), which scales
the time axis of its rotary positions (ComfyUI's ``LTXVConditioning``, diffusers' ``frame_rate``)."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...frame_rate import FrameRate
from ...frame_rate import frame_rates as video_frame_rates

DEFAULT_FRAME_RATE = 25.0  # ComfyUI model_base.LTXV.extra_conds and diffusers' LTXPipeline default
LTXFrameRate = FrameRate


def frame_rates(cond: Conditioning, batch: int, device: torch.device) -> torch.Tensor:
    """[batch] frame rates (float32) of ``cond``: its extras' or the default 25 fps."""
    fix = "set LTXVConditioning's frame_rate to the video's frames per second (25 by default)"
    return video_frame_rates(cond, batch, device, DEFAULT_FRAME_RATE, "LTX-Video", fix)
