"""The denoising engine: our own loop over a model adapter, with CFG and sequence parallelism.

Every rank of the mesh runs the same sampler on the whole (small) latent; the transformer work is
split: tokens over "sp" (Ulysses x Ring, inside the adapter) and the cond/uncond branches over
"cfg". Sampler math is ComfyUI's (``sampling``), so results match ComfyUI's KSampler.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.base import Conditioning, ModelAdapter
from ..parallel.mesh import ParallelMesh
from ..sampling import ModelSampling, default_noise, initial_noise, noise_latent, sample, sigmas_for_denoise
from .denoiser import Denoiser, expand_conditioning
from .settings import SamplingSettings

StepCallback = Callable[[int, int, torch.Tensor, torch.Tensor], None]  # (step, total, x, denoised)


def schedule(model_sampling: ModelSampling, settings: SamplingSettings) -> torch.Tensor:
    """The sigma schedule KSampler would use (or the explicit one)."""
    if settings.sigmas is not None:
        return torch.as_tensor(settings.sigmas, dtype=torch.float32).flatten()
    return sigmas_for_denoise(
        model_sampling, settings.scheduler, settings.steps, settings.denoise, sampler=settings.sampler
    )


def denoise_latent(
    adapter: ModelAdapter,
    mesh: ParallelMesh,
    model_sampling: ModelSampling,
    positive: Conditioning,
    negative: Conditioning | None,
    latent_raw: torch.Tensor,
    settings: SamplingSettings,
    *,
    attention_backend: str = "auto",
    on_step: StepCallback | None = None,
    start_model_space: torch.Tensor | None = None,
) -> torch.Tensor:
    """KSampler on a raw VAE latent (ComfyUI's LATENT convention): returns the raw latent.

    ``start_model_space`` replaces the noised start (for oracle tests that supply their own)."""
    fmt = adapter.plan.latent_format
    batch = latent_raw.shape[0]
    positive = expand_conditioning(positive, batch)
    negative = expand_conditioning(negative, batch)
    sigmas = schedule(model_sampling, settings)
    latent = fmt.to_model(latent_raw.float())
    if sigmas.numel() < 2:
        return latent_raw.clone()
    if start_model_space is None:
        noise = initial_noise(settings.seed, latent_raw.shape)
        x = noise_latent(model_sampling, sigmas, noise, latent)
    else:
        x = start_model_space.float()
    denoiser = Denoiser(
        adapter, mesh, model_sampling, positive, negative, settings.cfg, settings.guidance, attention_backend
    )
    noise_sampler = default_noise(settings.sampler, tuple(x.shape), sigmas, settings.seed)
    total = sigmas.numel() - 1

    def callback(step: int, x_now: torch.Tensor, denoised: torch.Tensor) -> None:
        if on_step is not None:
            on_step(step, total, x_now, denoised)

    with torch.no_grad():
        x = sample(
            settings.sampler, denoiser, x, sigmas, noise_sampler, model_sampling=model_sampling, callback=callback
        )
        x = model_sampling.inverse_noise_scaling(sigmas[-1], x)
    return fmt.to_raw(x)
