"""The denoise loop: a model adapter driven by ComfyUI's sampler math, with classifier-free guidance
(batched or CFG-parallel) and sequence parallelism inside the adapter.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "settings": ("SamplingSettings", "embedded_guidance", "model_sampling_for"),
        "denoiser": ("Denoiser", "can_batch", "concat_conditioning", "expand_conditioning"),
        "loop": ("StepCallback", "denoise_latent", "schedule"),
    },
)
