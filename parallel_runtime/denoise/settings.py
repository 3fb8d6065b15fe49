"""What one generation is asked for: KSampler's settings, plus what a LATENT and the graph add."""

from __future__ import annotations

import dataclasses

import torch

from ..models.base import ModelAdapter
from ..models.sampling_spec import ModelSamplingSpec
from .caching.specs import BlockCacheSpec, StepCacheSpec

DEFAULT_FLUX_GUIDANCE = 3.5  # ComfyUI's guidance for a conditioning entry without one (model_base.Flux.extra_conds)


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """What ComfyUI's KSampler (and KSamplerAdvanced) takes, plus the LATENT's batch_index, the model sampling
    in force and Flux's embedded guidance for conditioning entries that carry none."""

    seed: int = 0
    steps: int = 20
    cfg: float = 1.0
    sampler: str = "euler"
    scheduler: str = "simple"
    denoise: float = 1.0
    sigmas: torch.Tensor | None = None  # explicit schedule (overrides scheduler/steps/denoise)
    guidance: float | None = None  # Flux dev distilled guidance of entries without their own (None: 3.5)
    batch_index: tuple[int, ...] | None = None  # the LATENT's batch_index: item i gets noise draw batch_index[i]
    model_sampling: ModelSamplingSpec | None = None  # a ModelSampling* node's; None: the family's default
    # KSamplerAdvanced (the defaults are plain KSampler's): noise added to the input, the steps of the
    # schedule this pass runs, and whether a pass that stops early keeps its leftover noise
    add_noise: bool = True
    start_at_step: int = 0
    end_at_step: int = 10000
    return_with_leftover_noise: bool = False
    # a ComfyUI SAMPLER's noise options (SamplerEulerAncestral, ...); None: the sampler's default
    eta: float | None = None
    s_noise: float | None = None
    # Parallel EasyCache / LazyCache and Parallel Block Cache nodes (None: every step computes every block)
    step_cache: StepCacheSpec | None = None
    block_cache: BlockCacheSpec | None = None


def embedded_guidance(adapter: ModelAdapter, guidance: float | None) -> float | None:
    """The distilled guidance a guidance-embedding model (Flux dev) is given (its plan's default when
    unset: ComfyUI's, 3.5 for Flux); None for models without one."""
    if not adapter.plan.guidance_embed:
        return None
    return adapter.plan.default_guidance if guidance is None else guidance
