"""What LTX-2 adds to the shared Conditioning: the video's frame rate (``Conditioning.extras``), which divides the
time axis of its rotary positions (diffusers' ``LTX2Pipeline(frame_rate=...)``, 24 fps by default)."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras

DEFAULT_FRAME_RATE = 24.0  # diffusers' LTX2Pipeline default


@dataclasses.dataclass(frozen=True)
class LTX2FrameRate(ConditioningExtras):
    """The frame rate of each prompt's video (None: the default 24 fps)."""

    frame_rate: torch.Tensor | None = None  # [B] frames per second


def frame_rates(cond: Conditioning, batch: int, device: torch.device) -> torch.Tensor:
    """[batch] frame rates (float32) of ``cond``: its extras' or the default."""
    extras = cond.extras
    if extras is not None and not isinstance(extras, LTX2FrameRate):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to an LTX-2 model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this LTX-2 model",
        )
    rate = None if extras is None else extras.frame_rate
    if rate is None:
        return torch.full((batch,), DEFAULT_FRAME_RATE, dtype=torch.float32, device=device)
    rate = rate.to(device=device, dtype=torch.float32).reshape(-1)
    if rate.numel() == 1:
        rate = rate.expand(batch)
    if rate.numel() != batch or not bool((rate > 0).all()):
        raise ConfigError(
            f"LTX-2 frame rates {rate.tolist()} for a batch of {batch}",
            "the frame rate divides the time axis of the rotary positions: one positive rate per video",
            "give the video's frames per second (24 by default)",
        )
    return rate
