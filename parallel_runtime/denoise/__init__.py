"""The denoise loop: a model adapter driven by ComfyUI's sampler math, with classifier-free guidance
(batched or CFG-parallel) and sequence parallelism inside the adapter.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "settings": ("DEFAULT_FLUX_GUIDANCE", "SamplingSettings", "embedded_guidance"),
        "model_sampling": (
            "build_model_sampling",
            "model_sampling_auraflow_node",
            "model_sampling_flux_node",
            "model_sampling_for",
            "model_sampling_sd3_node",
        ),
        "entries": (
            "Branch",
            "CondEntry",
            "as_branch",
            "can_batch",
            "concat_conditioning",
            "expand_branch",
            "expand_conditioning",
        ),
        "denoiser": ("Denoiser",),
        "loop": ("StepCallback", "denoise_latent", "latent_to_model", "schedule", "start_noise"),
    },
)
