"""What LTX-2 adds to the shared Conditioning: the video's frame rate (``models.frame_rate``), which divides the
time axis of its rotary positions (diffusers' ``LTX2Pipeline(frame_rate=...)``, 24 fps by default)."""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...frame_rate import FrameRate
from ...frame_rate import frame_rates as video_frame_rates

DEFAULT_FRAME_RATE = 24.0  # diffusers' LTX2Pipeline default
LTX2FrameRate = FrameRate


def frame_rates(cond: Conditioning, batch: int, device: torch.device) -> torch.Tensor:
    """[batch] frame rates (float32) of ``cond``: its extras' or the default 24 fps."""
    fix = "give the video's frames per second (24 by default)"
    return video_frame_rates(cond, batch, device, DEFAULT_FRAME_RATE, "LTX-2", fix)
