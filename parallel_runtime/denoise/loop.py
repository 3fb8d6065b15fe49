"""The denoising engine: our own loop over a model adapter, with CFG and sequence parallelism.

Every rank of the mesh runs the same sampler on the whole (small) latent; the transformer work is
split: tokens over "sp" (Ulysses x Ring, inside the adapter) and the cond/uncond branches over
"cfg". Sampler math is ComfyUI's (``sampling``), so results match ComfyUI's KSampler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..attention.usp import SequenceParallelAttention
from ..errors import ConfigError
from ..models.base import Conditioning, ModelAdapter
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import (
    ModelSampling,
    cfg_combine,
    default_noise,
    discrete_eps,
    flow_flux,
    flow_sd3,
    initial_noise,
    noise_latent,
    sample,
    sigmas_for_denoise,
    uses_uncond,
)

StepCallback = Callable[[int, int, torch.Tensor, torch.Tensor], None]  # (step, total, x, denoised)


def model_sampling_for(
    adapter: ModelAdapter, scheduler_config: dict[str, Any], width: int, height: int
) -> ModelSampling:
    """ComfyUI's model sampling for the family: Flux dev (resolution-dependent shift), Flux schnell
    (shift 1), SD3 (the scheduler's shift, default 3), PixArt (discrete epsilon)."""
    plan = adapter.plan
    if plan.family == "flux":
        return flow_flux(width, height) if plan.guidance_embed else flow_sd3(1.0, 1.0)
    if plan.family == "sd3":
        return flow_sd3(float(scheduler_config.get("shift", 3.0)))
    if plan.family == "pixart":
        return discrete_eps()
    raise ConfigError(
        f"no model sampling known for family {plan.family!r}",
        "the sampler needs the model's noise parameterisation",
        "add the family to engine.model_sampling_for",
    )


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """What ComfyUI's KSampler takes, plus Flux's embedded guidance."""

    seed: int = 0
    steps: int = 20
    cfg: float = 1.0
    sampler: str = "euler"
    scheduler: str = "simple"
    denoise: float = 1.0
    sigmas: torch.Tensor | None = None  # explicit schedule (overrides scheduler/steps/denoise)
    guidance: float | None = None  # Flux dev distilled guidance


class Denoiser:
    """``denoiser(x, sigma) -> denoised`` for the whole latent, with classifier-free guidance.

    cfg mesh dimension of 2: rank cfg=0 evaluates the positive branch, cfg=1 the negative, and one
    all-gather over "cfg" gives both ranks both predictions (exact). Otherwise both branches run
    batched in one forward when their text shapes agree (as ComfyUI does), else one after another.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        mesh: ParallelMesh,
        model_sampling: ModelSampling,
        positive: Conditioning,
        negative: Conditioning | None,
        cfg: float,
        guidance: float | None = None,
        attention_backend: str = "auto",
    ):
        self.adapter, self.mesh, self.ms = adapter, mesh, model_sampling
        self.cfg = cfg
        self.use_uncond = uses_uncond(cfg, negative)
        self.positive, self.negative = positive, negative
        if adapter.plan.guidance_embed and guidance is None:
            guidance = 3.5
        self.guidance = guidance if adapter.plan.guidance_embed else None
        self.attention = SequenceParallelAttention(mesh, attention_backend)
        self.cfg_parallel = self.use_uncond and mesh.size("cfg") == 2
        self.evaluations = 0

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Denoised prediction of one (possibly batched) branch."""
        ms, adapter = self.ms, self.adapter
        sigma_b = sigma.reshape(1).expand(x.shape[0])
        x_in = ms.calculate_input(sigma_b.reshape(-1, 1, 1, 1), x)
        timestep = ms.timestep(sigma_b)
        self.attention.begin_forward((tuple(x.shape), tuple(cond.prompt_embeds.shape)))
        out = adapter.forward(x_in, timestep, cond, self.mesh, self.attention, guidance=self.guidance)
        self.evaluations += 1
        return ms.calculate_denoised(sigma_b.reshape(-1, 1, 1, 1), out.float(), x)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        x = x.float()
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(())
        if not self.use_uncond:
            return self._forward(x, sigma, self.positive)
        if self.cfg_parallel:
            mine = self.positive if self.mesh.rank("cfg") == 0 else self.negative
            pred = self._forward(x, sigma, mine)
            both = all_gather_cat(pred.contiguous(), self.mesh.group("cfg"), self.mesh.stats, dim=0, op="cfg")
            cond_pred, uncond_pred = both.chunk(2, dim=0)
            return cfg_combine(cond_pred, uncond_pred, self.cfg)
        pos, neg = self.positive, self.negative
        if _batchable(pos, neg):
            both = _concat(pos, neg)
            pred = self._forward(torch.cat([x, x]), sigma, both)
            cond_pred, uncond_pred = pred.chunk(2, dim=0)
        else:
            cond_pred, uncond_pred = self._forward(x, sigma, pos), self._forward(x, sigma, neg)
        return cfg_combine(cond_pred, uncond_pred, self.cfg)


def _batchable(a: Conditioning, b: Conditioning) -> bool:
    same = a.prompt_embeds.shape[1:] == b.prompt_embeds.shape[1:]
    same &= (a.pooled is None) == (b.pooled is None)
    same &= (a.attention_mask is None) == (b.attention_mask is None)
    return bool(same)


def _concat(a: Conditioning, b: Conditioning) -> Conditioning:
    def cat(x, y):
        return None if x is None else torch.cat([x, y.to(x.dtype)])

    return Conditioning(
        cat(a.prompt_embeds, b.prompt_embeds), cat(a.pooled, b.pooled), cat(a.attention_mask, b.attention_mask)
    )


def _expand_batch(cond: Conditioning | None, batch: int) -> Conditioning | None:
    """Repeat a single conditioning over the latent batch (ComfyUI does the same)."""
    if cond is None or cond.batch_size == batch:
        return cond
    if cond.batch_size != 1:
        raise ConfigError(
            f"conditioning has batch {cond.batch_size} but the latent has batch {batch}",
            "each latent in the batch needs one conditioning (or one shared by all)",
            "encode one prompt, or as many prompts as latents",
        )

    def rep(t):
        return None if t is None else t.expand(batch, *t.shape[1:]).contiguous()

    return Conditioning(rep(cond.prompt_embeds), rep(cond.pooled), rep(cond.attention_mask))


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
    positive = _expand_batch(positive, batch)
    negative = _expand_batch(negative, batch)
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
