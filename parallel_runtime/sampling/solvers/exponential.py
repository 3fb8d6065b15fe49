"""Multistep data-prediction solvers in lambda = -log sigma (docs/sampling.md §4.4, §4.5): dpmpp_2m
(DPM-Solver++(2M), Lu et al. 2022), the RES multistep family (Zhang et al. 2023) and the CFG++ samplers
(Chung et al. 2024), which step with the guided prediction and re-noise with the unconditional one."""

from __future__ import annotations

import torch

from ..protocol import Run, SamplerGen, ask, ask_guided
from ..trajectory import ancestral_split, derivative, half_log_snr, signal_scale


def dpmpp_2m(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """``x <- (sigma_{i+1}/sigma_i) x - (e^-h - 1) D^``, D^ extrapolated from the last two predictions."""
    lam = -sigmas.log()
    h = lam.diff()
    earlier: torch.Tensor | None = None
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        estimate = denoised
        if earlier is not None and target != 0:
            weight = 1 / (2 * (h[i - 1] / h[i]))
            estimate = (1 + weight) * denoised - weight * earlier
        x = ((-lam[i + 1]).exp() / (-lam[i]).exp()) * x - torch.expm1(-h[i]) * estimate
        earlier = denoised
    return x


def res_multistep(
    x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, ancestral: bool = False, cfg_pp: bool = False
) -> SamplerGen:
    """RES second-order multistep (arXiv 2308.02157) to sigma_down, with phi-function weights; the
    ancestral variants add noise of std sigma_up, the CFG++ ones re-noise from the unconditional prediction."""
    current, targets = sigmas[:-1], sigmas[1:]
    down, up = ancestral_split(current, targets, run.eta if ancestral else 0.0)
    history: tuple[torch.Tensor, torch.Tensor] | None = None  # (prediction, sigma_down) of the last step
    for i, (sigma, target) in enumerate(zip(current, targets)):
        if cfg_pp:
            denoised, uncond = yield from ask_guided(x, sigma, i)
        else:
            denoised = uncond = yield from ask(x, sigma, i)
        if down[i] == 0 or history is None:
            if cfg_pp:
                x = denoised + derivative(x, sigma, uncond) * down[i]
            else:
                x = x + derivative(x, sigma, denoised) * (down[i] - sigma)
        else:
            earlier, earlier_down = history
            lam, lam_down = -sigma.log(), -down[i].log()
            h = lam_down - lam
            c2 = (-sigmas[i - 1].log() - -earlier_down.log()) / h
            phi1 = torch.expm1(-h) / -h
            phi2 = (phi1 - 1.0) / -h
            b1 = torch.nan_to_num(phi1 - phi2 / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2 / c2, nan=0.0)
            if cfg_pp:
                x = x + (denoised - uncond)
            x = torch.exp(-h) * x + h * (b1 * uncond + b2 * earlier)
        if ancestral and target > 0:
            x = x + run.draw(sigma, target, x) * run.s_noise * up[i]
        history = (uncond, down[i])
    return x


def euler_cfg_pp(x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, ancestral: bool = False) -> SamplerGen:
    """DDIM with CFG++: land on the guided prediction, re-noise along the unconditional noise estimate
    (ancestral: part of it replaced by fresh noise, split on the VE-equivalent sigmas sigma / alpha)."""
    flow = run.model_sampling.is_flow
    lam = half_log_snr(sigmas, flow)
    alpha = signal_scale(sigmas, lam)
    eta = run.eta if ancestral else 0.0
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised, uncond = yield from ask_guided(x, sigma, i)
        if target == 0:
            x = denoised
            continue
        a_now, a_next = alpha[i], alpha[i + 1]
        noise_direction = derivative(x, sigma, a_now * uncond)
        down, up = ancestral_split(sigma / a_now, target / a_next, eta)
        x = a_next * denoised + (a_next * down) * noise_direction
        if eta > 0 and run.s_noise > 0:
            x = x + a_next * run.draw(sigma, target, x) * run.s_noise * up
    return x


def dpmpp_2s_ancestral_cfg_pp(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """DPM-Solver++(2S) ancestral with CFG++: each sub-step starts from ``x + D - U`` (U of the latest
    evaluation, as ComfyUI reads it)."""
    current, targets = sigmas[:-1], sigmas[1:]
    down, up = ancestral_split(current, targets, run.eta)
    for i, (sigma, target) in enumerate(zip(current, targets)):
        denoised, uncond = yield from ask_guided(x, sigma, i)
        if down[i] == 0:
            x = denoised + derivative(x, sigma, uncond) * down[i]
        else:
            lam, lam_down = -sigma.log(), -down[i].log()
            h = lam_down - lam
            start = (-lam).exp()
            sigma_mid = (-(lam + h / 2)).exp()
            x_mid = (sigma_mid / start) * (x + (denoised - uncond)) - torch.expm1(-h / 2) * denoised
            denoised_mid, uncond_mid = yield from ask_guided(x_mid, sigma_mid, i, 1)
            x = ((-lam_down).exp() / start) * (x + (denoised - uncond_mid)) - torch.expm1(-h) * denoised_mid
        if target > 0:
            x = x + run.draw(sigma, target, x) * run.s_noise * up[i]
    return x


def dpmpp_2m_cfg_pp(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """DPM-Solver++(2M) with CFG++: ``x <- D + e^-h (x - U)`` plus the multistep correction against the
    previous unconditional prediction."""
    h = (-sigmas.log()).diff()
    earlier: torch.Tensor | None = None
    for i, target in enumerate(sigmas[1:]):
        denoised, uncond = yield from ask_guided(x, sigmas[i], i)
        decay = torch.exp(-h[i])
        mix = -decay * uncond
        if earlier is not None and target != 0:
            mix = mix - torch.expm1(-h[i]) * (1 / (2 * (h[i - 1] / h[i]))) * (denoised - earlier)
        x = denoised + mix + decay * x
        earlier = uncond
    return x
