"""Quantities of a sigma schedule the samplers step with (docs/sampling.md §1), over whole tensors.

``sigmas`` may be one sigma or the whole schedule: every function is elementwise, so a sampler can
compute its coefficients for all steps at once.
"""

from __future__ import annotations

import torch

from .model_sampling import ModelSampling

FLOW_START_PERCENT = 1e-4
"""A flow schedule starting at sigma >= 1 (lambda = -inf) starts at percent_to_sigma(this) instead."""


def half_log_snr(sigmas: torch.Tensor, flow: bool) -> torch.Tensor:
    """lambda = log(alpha / sigma): ``-log sigma`` (alpha = 1) or ``log((1 - sigma) / sigma)`` (flow)."""
    return -sigmas.logit() if flow else -sigmas.log()


def sigma_at(lam: torch.Tensor, flow: bool) -> torch.Tensor:
    """The sigma of half-log-SNR ``lam`` (inverse of :func:`half_log_snr`)."""
    return torch.sigmoid(-lam) if flow else torch.exp(-lam)


def signal_scale(sigmas: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """alpha = sigma * e^lambda (1 for epsilon models, 1 - sigma for flow)."""
    return sigmas * lam.exp()


def offset_flow_start(sigmas: torch.Tensor, model_sampling: ModelSampling) -> torch.Tensor:
    """The schedule with a flow model's first sigma >= 1 moved to ``percent_to_sigma(1e-4)`` (finite lambda)."""
    if len(sigmas) <= 1 or not model_sampling.is_flow or not bool(sigmas[0] >= 1):
        return sigmas
    moved = sigmas.clone()
    moved[0] = model_sampling.percent_to_sigma(FLOW_START_PERCENT)
    return moved


def ancestral_split(sigma_from: torch.Tensor, sigma_to: torch.Tensor, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma_down, sigma_up) of k-diffusion's ancestral step (docs (A)): the deterministic target and
    the standard deviation of the fresh noise, with ``sigma_down^2 + sigma_up^2 = sigma_to^2``."""
    if not eta:
        return sigma_to, torch.zeros_like(sigma_to)
    spread = eta * (sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5
    up = torch.where(spread < sigma_to, spread, sigma_to)  # min() that keeps sigma_to where spread is NaN
    return (sigma_to**2 - up**2) ** 0.5, up


def flow_ancestral_split(
    sigma_from: torch.Tensor, sigma_to: torch.Tensor, eta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ComfyUI's rectified-flow ancestral step (docs (A-flow)): (sigma_down, the rescale alpha_to /
    alpha_down applied after the deterministic step, the standard deviation of the fresh noise)."""
    down = sigma_to * (1 + (sigma_to / sigma_from - 1) * eta)
    alpha_to, alpha_down = 1 - sigma_to, 1 - down
    renoise = (sigma_to**2 - down**2 * alpha_to**2 / alpha_down**2) ** 0.5
    return down, alpha_to / alpha_down, renoise


def derivative(x: torch.Tensor, sigma: torch.Tensor, denoised: torch.Tensor) -> torch.Tensor:
    """d = (x - D) / sigma: the derivative of the probability-flow ODE in sigma (docs (ODE))."""
    return (x - denoised) / sigma
