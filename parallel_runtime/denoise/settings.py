"""What one generation is asked for (KSampler's settings) and the model sampling of a family."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import ConfigError
from ..models.base import ModelAdapter
from ..sampling import FluxFlowSampling, ModelSampling, discrete_eps, flow_flux, flow_sd3

DEFAULT_FLUX_GUIDANCE = 3.5  # ComfyUI's FluxGuidance default
WAN_SHIFT = 8.0  # ComfyUI 0.3.64 sampling_settings of WAN21_T2V, inherited by WAN21_I2V and WAN22_T2V (TI2V-5B)
# (issue 13: the Wan entry of the per-family defaults that issue 11 gathers into one table; merge there)


def model_sampling_for(
    adapter: ModelAdapter, scheduler_config: dict[str, Any], width: int, height: int
) -> ModelSampling:
    """ComfyUI's model sampling for the family: Flux dev (resolution-dependent shift), Flux schnell
    (shift 1), SD3 (the scheduler's shift, default 3), PixArt (discrete epsilon), Wan (shift 8)."""
    plan = adapter.plan
    if plan.family == "flux":
        return flow_flux(width, height) if plan.guidance_embed else flow_sd3(1.0, 1.0)
    if plan.family == "sd3":
        return flow_sd3(float(scheduler_config.get("shift", 3.0)))
    if plan.family == "pixart":
        return discrete_eps()
    # Issue 14 families (until issue 11's per-family table lands): ComfyUI's supported_models values,
    # a flux-type shift fixed per model (QwenImage 1.15, Flux2 2.02), timestep = sigma.
    if plan.family == "qwen-image":
        return FluxFlowSampling(1.15)
    if plan.family == "flux2":
        return FluxFlowSampling(2.02)
    if plan.family == "wan":  # every Wan variant: ModelSamplingDiscreteFlow, shift 8, multiplier 1000
        return flow_sd3(WAN_SHIFT)
    raise ConfigError(
        f"no model sampling known for family {plan.family!r}",
        "the sampler needs the model's noise parameterisation",
        "add the family to denoise.settings.model_sampling_for",
    )


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """What ComfyUI's KSampler (and KSamplerAdvanced) takes, plus Flux's embedded guidance."""

    seed: int = 0
    steps: int = 20
    cfg: float = 1.0
    sampler: str = "euler"
    scheduler: str = "simple"
    denoise: float = 1.0
    sigmas: torch.Tensor | None = None  # explicit schedule (overrides scheduler/steps/denoise)
    guidance: float | None = None  # Flux dev distilled guidance
    # KSamplerAdvanced (the defaults are plain KSampler's): noise added to the input, the steps of the
    # schedule this pass runs, and whether a pass that stops early keeps its leftover noise
    add_noise: bool = True
    start_at_step: int = 0
    end_at_step: int = 10000
    return_with_leftover_noise: bool = False


def embedded_guidance(adapter: ModelAdapter, guidance: float | None) -> float | None:
    """The distilled guidance a guidance-embedding model (Flux dev) is given (its default when
    unset); None for models without one."""
    if not adapter.plan.guidance_embed:
        return None
    return DEFAULT_FLUX_GUIDANCE if guidance is None else guidance
