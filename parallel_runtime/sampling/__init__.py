"""Sampling with ComfyUI's math: model sampling objects, schedulers, k-diffusion samplers, noise, CFG."""

from .cfg import cfg_combine, cfg_needs_uncond, uses_uncond
from .model_sampling import (
    BETA_SCHEDULES,
    FLUX_DEFAULT_SHIFT,
    DiscreteEpsSampling,
    DiscreteFlowSampling,
    FluxFlowSampling,
    ModelSampling,
    discrete_eps,
    flow_flux,
    flow_sd3,
    flux_shift,
    is_max_denoise,
    noise_latent,
)
from .noise import BrownianTreeNoise, GeneratorNoise, NoiseSampler, NoiseView, Region, SharedNoise, initial_noise
from .samplers import SAMPLER_NAMES, ModelCall, default_noise, sample, sampler_steps, sampler_uses_noise
from .schedulers import SCHEDULER_NAMES, calculate_sigmas, sigmas_for_denoise

__all__ = [
    "BETA_SCHEDULES",
    "FLUX_DEFAULT_SHIFT",
    "SAMPLER_NAMES",
    "SCHEDULER_NAMES",
    "BrownianTreeNoise",
    "DiscreteEpsSampling",
    "DiscreteFlowSampling",
    "FluxFlowSampling",
    "GeneratorNoise",
    "ModelCall",
    "ModelSampling",
    "NoiseSampler",
    "NoiseView",
    "Region",
    "SharedNoise",
    "calculate_sigmas",
    "cfg_combine",
    "cfg_needs_uncond",
    "uses_uncond",
    "default_noise",
    "discrete_eps",
    "flow_flux",
    "flow_sd3",
    "flux_shift",
    "initial_noise",
    "is_max_denoise",
    "noise_latent",
    "sample",
    "sampler_steps",
    "sampler_uses_noise",
    "sigmas_for_denoise",
]
