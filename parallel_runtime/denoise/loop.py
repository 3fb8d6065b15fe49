"""The denoising engine: our own loop over a model adapter, with CFG and sequence parallelism.

Every rank of the mesh runs the same sampler on the whole (small) latent; the transformer work is
split: tokens over "sp" (Ulysses x Ring, inside the adapter) and the cond/uncond branches over
"cfg". Sampler math is ComfyUI's (``sampling``), so results match ComfyUI's KSampler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..models.base import Conditioning, LatentFormat, ModelAdapter
from ..parallel.mesh import ParallelMesh
from ..sampling import (
    Guided,
    ModelSampling,
    default_noise,
    final_sigma,
    initial_noise,
    noise_latent,
    sample,
    sampler_spec,
    sigmas_for_denoise,
)
from .caching.cached_denoiser import CachedDenoiser
from .caching.decisions import DecisionGroup
from .control import ControlRunner, refuse_with_cache
from .denoiser import Denoiser
from .entries import Branch, as_branch, expand_branch
from .settings import SamplingSettings

StepCallback = Callable[[int, int, torch.Tensor, torch.Tensor], None]  # (step, total, x, denoised)
CacheReport = Callable[[list[dict]], None]  # what each cache did (CachedDenoiser.summary), once at the end


def schedule(model_sampling: ModelSampling, settings: SamplingSettings) -> torch.Tensor:
    """The sigma schedule KSampler would use (or the explicit one), cut to the steps of a
    KSamplerAdvanced pass. Fewer than two sigmas: nothing to sample (the input comes back)."""
    if settings.sigmas is not None:
        sigmas = torch.as_tensor(settings.sigmas, dtype=torch.float32).flatten()
    else:
        sigmas = sigmas_for_denoise(
            model_sampling, settings.scheduler, settings.steps, settings.denoise, sampler=settings.sampler
        )
    return step_window(sigmas, settings)


def step_window(sigmas: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """ComfyUI's ``KSampler.sample`` cut: up to ``end_at_step`` (its last sigma set to 0 unless the
    leftover noise is returned), then from ``start_at_step`` (a start at or past the end leaves one sigma:
    the input latent comes back unchanged)."""
    end, start = settings.end_at_step, settings.start_at_step
    if end < sigmas.numel() - 1:
        sigmas = sigmas[: end + 1].clone()
        if not settings.return_with_leftover_noise:
            sigmas[-1] = 0.0
    if start > 0:
        sigmas = sigmas[start:] if start < sigmas.numel() - 1 else sigmas[-1:]
    return sigmas


def prepare_denoise_mask(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A LATENT's ``noise_mask`` at the latent's shape, as ComfyUI prepares it (``comfy.utils.reshape_mask``:
    interpolated to the latent's size, repeated over channels and batch). 1 = denoise, 0 = keep."""
    dims = len(shape) - 2
    mask = mask.float()
    if dims == 3 and mask.ndim < 5:
        mask = mask.reshape(1, 1, -1, *mask.shape[-2:])
    elif dims == 2:
        mask = mask.reshape(-1, 1, *mask.shape[-2:])
    mask = torch.nn.functional.interpolate(mask, size=tuple(shape[2:]), mode="trilinear" if dims == 3 else "bilinear")
    if mask.shape[1] < shape[1]:
        mask = mask.repeat(1, shape[1], *([1] * dims))[:, : shape[1]]
    reps = -(-shape[0] // mask.shape[0])
    return mask.repeat(reps, *([1] * (mask.ndim - 1)))[: shape[0]]


class Inpainting:
    """ComfyUI's ``KSamplerX0Inpaint``: before each model call the kept region (mask 0) is set to the
    input latent (re-noised to the current sigma, or clean for families that keep it clean, ComfyUI's
    WAN22), and the prediction there is the input latent (a CFG++ sampler's unconditional prediction
    stays the model's)."""

    def __init__(
        self,
        denoiser: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        mask: torch.Tensor,
        latent: torch.Tensor,
        noise: torch.Tensor,
        model_sampling: ModelSampling,
        clean: bool,
    ):
        self.denoiser, self.mask, self.latent, self.noise, self.ms, self.clean = (
            denoiser, mask, latent, noise, model_sampling, clean
        )  # fmt: skip

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        keep = 1.0 - self.mask
        fill = self.latent if self.clean else self.ms.noise_scaling(sigma, self.noise, self.latent)
        out = self.denoiser(x * self.mask + fill * keep, sigma)
        if isinstance(out, Guided):
            return Guided(out.denoised * self.mask + self.latent * keep, out.uncond)
        return out * self.mask + self.latent * keep


class Experts:
    """Two experts switched by noise level (Wan 2.2 A14B): the first for sigma >= ``boundary``, the
    second below, as diffusers' Wan pipelines switch at ``boundary_ratio``."""

    def __init__(self, high: Callable, low: Callable, boundary: float):
        self.high, self.low, self.boundary = high, low, boundary

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        return (self.high if float(sigma) >= self.boundary else self.low)(x, sigma)


def latent_to_model(fmt: LatentFormat, latent_raw: torch.Tensor) -> torch.Tensor:
    """The start latent in model space. An all-zero LATENT (an empty latent) stays zero: ComfyUI does not
    shift the empty latent image (comfy/samplers.py ``CFGGuider.inner_sample``), only a real one."""
    latent_raw = latent_raw.float()
    return fmt.to_model(latent_raw) if bool(torch.count_nonzero(latent_raw)) else latent_raw.clone()


def start_noise(settings: SamplingSettings, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """The initial noise ComfyUI's KSampler draws for the LATENT (its batch_index honoured)."""
    return initial_noise(settings.seed, tuple(shape), batch_index=settings.batch_index)


def inpaint_noise(settings: SamplingSettings, start: torch.Tensor) -> torch.Tensor:
    """The noise the kept region of a noise mask is re-noised with: the start noise, or for ddim a
    fresh draw seeded ``seed + 1`` (ComfyUI's ``inpaint_options`` random, with or without added noise)."""
    offset = sampler_spec(settings.sampler).inpaint_seed_offset
    if offset is None:
        return start
    return initial_noise(settings.seed + offset, tuple(start.shape)).to(start.device)


def denoise_latent(
    adapter: ModelAdapter,
    mesh: ParallelMesh,
    model_sampling: ModelSampling,
    positive: Branch | Conditioning,
    negative: Branch | Conditioning | None,
    latent_raw: torch.Tensor,
    settings: SamplingSettings,
    *,
    attention_backend: str = "auto",
    on_step: StepCallback | None = None,
    start_model_space: torch.Tensor | None = None,
    noise_mask: torch.Tensor | None = None,
    expert_2: tuple[ModelAdapter, float] | None = None,
    cache_report: CacheReport | None = None,
    decision_group: DecisionGroup | None = None,
    controls: Mapping[str, ControlRunner] | None = None,
) -> torch.Tensor:
    """KSampler / KSamplerAdvanced on a raw VAE latent (ComfyUI's LATENT convention): returns the raw latent.

    ``positive`` / ``negative`` are a Conditioning or a branch of entries (``entries.CondEntry``).
    ``noise_mask``: the LATENT's noise mask (inpainting; Wan22ImageToVideoLatent keeps the first frame).
    ``expert_2``: (second expert, boundary sigma): it denoises below the boundary (Wan 2.2 A14B).
    ``controls``: the loaded ControlNets (by file) the entries' control chains name (not with a cache).
    ``start_model_space`` replaces the noised start (for oracle tests that supply their own).
    The settings' ``step_cache`` / ``block_cache`` run the evaluations through those caches
    (``caching.CachedDenoiser``; ``decision_group`` replaces the ranks' decision group, for tests); then
    ``cache_report`` gets what they did."""
    refuse_with_cache(tuple(controls or ()), settings.step_cache, settings.block_cache)
    fmt = adapter.plan.latent_format
    batch = latent_raw.shape[0]
    positive = expand_branch(as_branch(positive), batch)
    negative = expand_branch(as_branch(negative), batch)
    sigmas = schedule(model_sampling, settings)
    if sigmas.numel() < 2:
        return latent_raw.clone()
    latent = latent_to_model(fmt, latent_raw)
    noise = start_noise(settings, latent_raw.shape) if settings.add_noise else torch.zeros(latent_raw.shape)
    noise = noise.to(latent.device)
    x = noise_latent(model_sampling, sigmas, noise, latent) if start_model_space is None else start_model_space.float()
    mask = None if noise_mask is None else prepare_denoise_mask(noise_mask, tuple(latent.shape)).to(latent.device)
    with_uncond = sampler_spec(settings.sampler).cfg_pp

    cached: list[CachedDenoiser] = []

    def make(expert: ModelAdapter) -> Callable:
        args = (expert, mesh, model_sampling, positive, negative, settings.cfg, settings.guidance, attention_backend)
        if settings.step_cache is None and settings.block_cache is None:
            inner = Denoiser(*args, with_uncond=with_uncond)
        else:
            inner = CachedDenoiser(
                *args,
                with_uncond=with_uncond,
                step_cache=settings.step_cache,
                block_cache=settings.block_cache,
                decision_group=decision_group,
            )
            cached.append(inner)
        inner.denoise_mask = mask
        inner.controls = dict(controls or {})
        if mask is None:
            return inner
        fill_noise = inpaint_noise(settings, noise)
        return Inpainting(inner, mask, latent, fill_noise, model_sampling, expert.plan.inpaint_with_clean_latent)

    denoiser = make(adapter) if expert_2 is None else Experts(make(adapter), make(expert_2[0]), expert_2[1])
    noise_sampler = default_noise(settings.sampler, tuple(x.shape), sigmas, settings.seed)
    total = sigmas.numel() - 1

    def callback(step: int, x_now: torch.Tensor, denoised: torch.Tensor) -> None:
        if on_step is not None:
            on_step(step, total, x_now, denoised)

    with torch.no_grad():
        x = sample(
            settings.sampler,
            denoiser,
            x,
            sigmas,
            noise_sampler,
            model_sampling=model_sampling,
            eta=settings.eta,
            s_noise=settings.s_noise,
            callback=callback,
        )
        x = model_sampling.inverse_noise_scaling(final_sigma(settings.sampler, sigmas), x)
    if cache_report is not None and cached:
        cache_report([summary for d in cached for summary in d.summary()])
    return fmt.to_raw(x)
