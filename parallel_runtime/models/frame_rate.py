"""A video's frame rate on the shared Conditioning (``Conditioning.extras``), for the video models whose rotary
positions measure time in seconds (the frame index over the frame rate); each family states its default."""

from __future__ import annotations

import dataclasses

import torch

from ..errors import ConfigError
from .base import Conditioning, ConditioningExtras


@dataclasses.dataclass(frozen=True)
class FrameRate(ConditioningExtras):
    """The frame rate of each prompt's video (None: the model's default)."""

    frame_rate: torch.Tensor | None = None  # [B] frames per second


def frame_rates(cond: Conditioning, batch: int, device: torch.device, default: float, model: str, fix: str):
    """[batch] frame rates (float32) of ``cond``: its extras' or ``default``; a ConfigError naming ``model`` and
    ``fix`` for extras of another kind or rates that are not one positive number per video."""
    extras = cond.extras
    if extras is not None and not isinstance(extras, FrameRate):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to an {model} model",
            "a family's extra conditioning inputs belong to that family's model",
            f"encode the prompt for this {model} model ({fix})",
        )
    rate = None if extras is None else extras.frame_rate
    if rate is None:
        return torch.full((batch,), float(default), dtype=torch.float32, device=device)
    rate = rate.to(device=device, dtype=torch.float32).reshape(-1)
    if rate.numel() == 1:
        rate = rate.expand(batch)
    if rate.numel() != batch or not bool((rate > 0).all()):
        raise ConfigError(
            f"{model} frame rates {rate.tolist()} for a batch of {batch}",
            "the frame rate sets the time axis of the rotary positions: one positive rate per video",
            fix,
        )
    return rate
