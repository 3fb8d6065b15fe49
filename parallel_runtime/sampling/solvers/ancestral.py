"""Ancestral samplers (docs/sampling.md §4.3, §4.7): a deterministic step to a lower noise level, then
fresh noise up to the next one. euler_ancestral, dpm_2_ancestral, dpmpp_2s_ancestral (each with
ComfyUI's rectified-flow variant), ddpm and lcm."""

from __future__ import annotations

import torch

from ..protocol import Run, SamplerGen, ask
from ..trajectory import ancestral_split, derivative, flow_ancestral_split, half_log_snr, sigma_at


def euler_ancestral(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """Euler to sigma_down, then noise of std sigma_up (flow models: the flow split, then renoise)."""
    current, targets = sigmas[:-1], sigmas[1:]
    if run.model_sampling.is_flow:
        down, rescale, renoise = flow_ancestral_split(current, targets, run.eta)
    else:
        down, up = ancestral_split(current, targets, run.eta)
    for i, (sigma, target) in enumerate(zip(current, targets)):
        denoised = yield from ask(x, sigma, i)
        if not run.model_sampling.is_flow:
            if down[i] == 0:
                x = denoised
            else:
                x = x + derivative(x, sigma, denoised) * (down[i] - sigma)
                x = x + run.draw(sigma, target, x) * run.s_noise * up[i]
        elif target == 0:
            x = denoised
        else:
            kept = down[i] / sigma
            x = kept * x + (1 - kept) * denoised
            if run.eta > 0:
                x = rescale[i] * x + run.draw(sigma, target, x) * run.s_noise * renoise[i]
    return x


def dpm_2_ancestral(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """dpm_2's log-sigma midpoint step to sigma_down, then the ancestral noise (flow: split and renoise)."""
    flow = run.model_sampling.is_flow
    current, targets = sigmas[:-1], sigmas[1:]
    if flow:
        down, rescale, spread = flow_ancestral_split(current, targets, run.eta)
    else:
        down, spread = ancestral_split(current, targets, run.eta)
        rescale = torch.ones_like(down)
    for i, (sigma, target) in enumerate(zip(current, targets)):
        slope = derivative(x, sigma, (yield from ask(x, sigma, i)))
        if down[i] == 0:
            x = x + slope * (down[i] - sigma)
            continue
        middle = sigma.log().lerp(down[i].log(), 0.5).exp()
        halfway = x + slope * (middle - sigma)
        x = x + derivative(halfway, middle, (yield from ask(halfway, middle, i, 1))) * (down[i] - sigma)
        if flow:
            x = rescale[i] * x
        x = x + run.draw(sigma, target, x) * run.s_noise * spread[i]
    return x


def dpmpp_2s_ancestral(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """DPM-Solver++(2S) (Lu et al. 2022) to sigma_down with the midpoint in lambda, then ancestral noise."""
    if run.model_sampling.is_flow:
        return (yield from _dpmpp_2s_ancestral_flow(x, sigmas, run))
    current, targets = sigmas[:-1], sigmas[1:]
    down, up = ancestral_split(current, targets, run.eta)
    for i, (sigma, target) in enumerate(zip(current, targets)):
        denoised = yield from ask(x, sigma, i)
        if down[i] == 0:
            x = x + derivative(x, sigma, denoised) * (down[i] - sigma)
        else:
            lam, lam_down = -sigma.log(), -down[i].log()
            h = lam_down - lam
            lam_mid = lam + h / 2
            sigma_mid = (-lam_mid).exp()
            start = (-lam).exp()
            x_mid = (sigma_mid / start) * x - torch.expm1(-h / 2) * denoised
            denoised_mid = yield from ask(x_mid, sigma_mid, i, 1)
            x = ((-lam_down).exp() / start) * x - torch.expm1(-h) * denoised_mid
        if target > 0:
            x = x + run.draw(sigma, target, x) * run.s_noise * up[i]
    return x


FLOW_FIRST_MIDPOINT = 0.9999
"""dpmpp_2s_ancestral's midpoint on a flow model's first step from sigma = 1 (where lambda is -inf)."""


def _dpmpp_2s_ancestral_flow(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    current, targets = sigmas[:-1], sigmas[1:]
    down, rescale, renoise = flow_ancestral_split(current, targets, run.eta)
    for i, (sigma, target) in enumerate(zip(current, targets)):
        denoised = yield from ask(x, sigma, i)
        if target == 0:
            x = x + derivative(x, sigma, denoised) * (down[i] - sigma)
        else:
            if sigma == 1.0:
                sigma_mid = torch.tensor(FLOW_FIRST_MIDPOINT, dtype=sigma.dtype)
            else:
                lam, lam_down = half_log_snr(sigma, True), half_log_snr(down[i], True)
                sigma_mid = sigma_at(lam + (lam_down - lam) / 2, True)
            kept = sigma_mid / sigma
            x_mid = kept * x + (1 - kept) * denoised
            denoised_mid = yield from ask(x_mid, sigma_mid, i, 1)
            kept = down[i] / sigma
            x = kept * x + (1 - kept) * denoised_mid
        if target > 0 and run.eta > 0:
            x = rescale[i] * x + run.draw(sigma, target, x) * run.s_noise * renoise[i]
    return x


def ddpm(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """The DDPM ancestral step (Ho et al. 2020) of the VP chain with alpha-bar = 1 / (1 + sigma^2)."""
    alpha_bar = 1 / (sigmas * sigmas + 1)
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        keep = alpha_bar[i] / alpha_bar[i + 1]
        noise_estimate = (x - denoised) / sigma
        x_vp = x / torch.sqrt(1.0 + sigma**2.0)
        mean = (1.0 / keep).sqrt() * (x_vp - (1 - keep) * noise_estimate / (1 - alpha_bar[i]).sqrt())
        if target > 0:
            spread = ((1 - keep) * (1.0 - alpha_bar[i + 1]) / (1.0 - alpha_bar[i])).sqrt()
            mean = mean + spread * run.draw(sigma, target, x)
        x = mean * torch.sqrt(1.0 + target**2.0) if target != 0 else mean
    return x


def lcm(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """Latent consistency: jump to the prediction, then re-noise it with the model's own noise scaling."""
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        x = yield from ask(x, sigma, i)
        if target > 0:
            x = run.model_sampling.noise_scaling(target, run.draw(sigma, target, x), x)
    return x
