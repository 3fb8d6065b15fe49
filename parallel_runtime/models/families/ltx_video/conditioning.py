"""What LTX-Video adds to the shared Conditioning: the video's frame rate (``Conditioning.extras``), which scales
the time axis of its rotary positions (ComfyUI's ``LTXVConditioning``, diffusers' ``frame_rate``)."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras

DEFAULT_FRAME_RATE = 25.0  # ComfyUI model_base.LTXV.extra_conds and diffusers' LTXPipeline default


@dataclasses.dataclass(frozen=True)
class LTXFrameRate(ConditioningExtras):
    """The frame rate of each prompt's video (None: the default 25 fps)."""

    frame_rate: torch.Tensor | None = None  # [B] frames per second


def frame_rates(cond: Conditioning, batch: int, device: torch.device) -> torch.Tensor:
    """[batch] frame rates (float32) of ``cond``: its extras' or the default."""
    extras = cond.extras
    if extras is not None and not isinstance(extras, LTXFrameRate):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to an LTX-Video model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this LTX-Video model (its T5 text encoder, LTXVConditioning for the frame rate)",
        )
    rate = None if extras is None else extras.frame_rate
    if rate is None:
        return torch.full((batch,), DEFAULT_FRAME_RATE, dtype=torch.float32, device=device)
    rate = rate.to(device=device, dtype=torch.float32).reshape(-1)
    if rate.numel() == 1:
        rate = rate.expand(batch)
    if rate.numel() != batch or not bool((rate > 0).all()):
        raise ConfigError(
            f"LTX-Video frame rates {rate.tolist()} for a batch of {batch}",
            "the frame rate scales the time axis of the rotary positions: one positive rate per video",
            "set LTXVConditioning's frame_rate to the video's frames per second (25 by default)",
        )
    return rate
