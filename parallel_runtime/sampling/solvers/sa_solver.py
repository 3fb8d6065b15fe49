"""SA-Solver (Xue et al. 2023), the stochastic Adams predictor-corrector in the data-prediction form
over the model's half-log-SNR (docs/sampling.md §4.6).

A K-step stochastic Adams step from lambda_s to lambda_t with the stored predictions D_j at lambda_j and
stochasticity tau (kappa = 1 + tau^2) is ``x_t = (sigma_t/sigma_s) e^(-tau^2 h) x_s + sum_j b_j D_j``
with ``b_j = alpha_t kappa int_s^t e^(kappa (l - lambda_t)) l_j(l) dl`` over the Lagrange basis l_j.
"""

from __future__ import annotations

import torch

from ..protocol import Run, SamplerGen, ask
from ..trajectory import half_log_snr, offset_flow_start

STOCHASTIC_PERCENTS = (0.2, 0.8)
"""tau = 1 while sigma lies between percent_to_sigma of these (ComfyUI's default interval), else 0."""


def adams_weights(
    sigma_t: torch.Tensor, nodes: torch.Tensor, lam_s: torch.Tensor, lam_t: torch.Tensor, tau: float
) -> torch.Tensor:
    """The b_j of one step: the Lagrange integrals solve ``sum_j w_j nodes_j^p = m_p`` for the moments
    ``m_p = kappa int e^(kappa (l - lambda_t)) l^p dl`` (p < K), which integration by parts gives as
    ``m_p = (t^p - s^p e^(-kappa h)) - (p / kappa) m_(p-1)``; ``b = alpha_t w``."""
    kappa = 1 + tau**2
    decay = (-kappa * (lam_t - lam_s)).exp()
    moments: list[torch.Tensor] = []
    for p in range(len(nodes)):
        boundary = lam_t**p - lam_s**p * decay
        moments.append(boundary if p == 0 else boundary - (p / kappa) * moments[-1])
    powers = torch.stack([nodes**p for p in range(len(nodes))])
    return sigma_t * lam_t.exp() * torch.linalg.solve(powers, torch.stack(moments))


def _combine(weights: torch.Tensor, predictions: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros_like(predictions[0])
    for w, prediction in zip(weights, predictions):
        total = total + w * prediction
    return total


def sa_solver(
    x: torch.Tensor,
    sigmas: torch.Tensor,
    run: Run,
    *,
    pece: bool = False,
    predictor_order: int = 3,
    corrector_order: int = 4,
) -> SamplerGen:
    """Predict with a stochastic Adams step, evaluate, correct with the step that includes the new
    prediction (PECE: and evaluate again at the corrected point)."""
    if len(sigmas) <= 1:
        return x
    ms = run.model_sampling
    sigmas = offset_flow_start(sigmas, ms)
    lam = half_log_snr(sigmas, ms.is_flow)
    high, low = (ms.percent_to_sigma(p) for p in STOCHASTIC_PERCENTS)

    def stochasticity(sigma: torch.Tensor) -> float:
        return 1.0 if high >= sigma.item() >= low else 0.0

    steps = len(sigmas) - 1
    ends_at_zero = sigmas[-1].item() == 0
    kept = max(predictor_order, corrector_order)
    predictions: list[torch.Tensor] = []
    x_pred, tau, h, noise = x, 0.0, None, None
    for i in range(steps):
        sigma, target = sigmas[i], sigmas[i + 1]
        denoised = yield from ask(x_pred, sigma, i)
        predictions = [*predictions, denoised][-kept:]
        p_order = min(predictor_order, len(predictions))
        no_corrector = i == 0 or (target == 0 and not pece)
        c_order = 0 if no_corrector else min(corrector_order, len(predictions))
        if ends_at_zero:  # lower orders towards the end
            p_order, c_order = min(p_order, steps - 1 - i), min(c_order, steps - i)
        if c_order == 0:
            x = x_pred
        else:
            b = adams_weights(sigma, lam[i - c_order + 1 : i + 1], lam[i - 1], lam[i], tau)
            x = sigma / sigmas[i - 1] * (-(tau**2) * h).exp() * x + _combine(b, predictions[-c_order:])
            if tau > 0 and run.s_noise > 0:
                x = x + noise
            if pece:
                denoised = yield from ask(x, sigma, i, 1)
                predictions[-1] = denoised
        if target == 0:
            x = denoised
            continue
        tau = stochasticity(target)
        b = adams_weights(target, lam[i - p_order + 1 : i + 1], lam[i], lam[i + 1], tau)
        h = lam[i + 1] - lam[i]
        x_pred = target / sigma * (-(tau**2) * h).exp() * x + _combine(b, predictions[-p_order:])
        if tau > 0 and run.s_noise > 0:
            noise = run.draw(sigma, target, x) * target * (-2 * tau**2 * h).expm1().neg().sqrt() * run.s_noise
            x_pred = x_pred + noise
    return x
