"""Sampling with ComfyUI's math on plain tensors: model sampling objects, schedulers, k-diffusion
samplers, noise, CFG. Pure math: no torch.distributed, nothing of the engine but the shared ``errors`` (and ``exports``).
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "cfg": ("cfg_combine", "cfg_needs_uncond", "uses_uncond"),
        "model_sampling": (
            "BETA_SCHEDULES",
            "FLUX_DEFAULT_SHIFT",
            "DiscreteEpsSampling",
            "DiscreteFlowSampling",
            "FluxFlowSampling",
            "ModelSampling",
            "discrete_eps",
            "flow_flux",
            "flow_sd3",
            "flux_shift",
            "is_max_denoise",
            "noise_latent",
        ),
        "noise": (
            "BrownianTreeNoise",
            "GeneratorNoise",
            "NoiseSampler",
            "NoiseView",
            "Region",
            "SharedNoise",
            "initial_noise",
        ),
        "protocol": ("Guided", "ModelCall"),
        "samplers": (
            "SAMPLERS",
            "SAMPLER_NAMES",
            "SamplerSpec",
            "default_noise",
            "drops_penultimate_sigma",
            "final_sigma",
            "sample",
            "sampler_needs_uncond",
            "sampler_spec",
            "sampler_steps",
            "sampler_uses_noise",
        ),
        "schedulers": ("SCHEDULERS", "SCHEDULER_NAMES", "calculate_sigmas", "sigmas_for_denoise"),
    },
)
