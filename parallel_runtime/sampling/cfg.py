"""Classifier-free guidance on denoised predictions, as ComfyUI's cfg_function combines them."""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError


def cfg_needs_uncond(cfg: float) -> bool:
    """False when ``cfg`` is 1: ComfyUI then skips the unconditional pass (its cfg1 optimisation)."""
    return not math.isclose(cfg, 1.0)


def uses_uncond(cfg: float, negative: object | None) -> bool:
    """Whether guidance at ``cfg`` evaluates the negative branch; raises if it needs one and none
    was given."""
    needed = cfg_needs_uncond(cfg)
    if needed and negative is None:
        raise ConfigError(
            f"cfg={cfg} needs a negative conditioning but none was given",
            "classifier-free guidance extrapolates from the negative (unconditional) prediction",
            "connect a negative prompt (an empty prompt is fine) or set cfg to 1.0",
        )
    return needed


def cfg_combine(cond_denoised: torch.Tensor, uncond_denoised: torch.Tensor | None, cfg: float) -> torch.Tensor:
    """``uncond + (cond - uncond) * cfg``; ``uncond_denoised`` may be None only when cfg is 1."""
    if uncond_denoised is None:
        if cfg_needs_uncond(cfg):
            raise ConfigError(
                f"cfg_combine got no unconditional prediction with cfg={cfg}",
                "guidance with a scale other than 1 extrapolates from the unconditional prediction",
                "evaluate the negative prompt too (see cfg_needs_uncond), or use cfg=1.0",
            )
        return cond_denoised
    return uncond_denoised + (cond_denoised - uncond_denoised) * cfg
