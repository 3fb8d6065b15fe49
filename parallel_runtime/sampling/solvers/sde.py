"""SDE solvers in the data-prediction form over the model's half-log-SNR (docs/sampling.md §4.6):
DPM-Solver++ SDE (2 stages), DPM-Solver++(2M)/(3M) SDE (Lu et al. 2022), SEEDS-2/3 (Gonzalez et al.
2023) and ER-SDE-Solver-3 (Cui et al. 2023).

One step from sigma_s to sigma_t with the prediction D held fixed solves the noise-injecting SDE exactly:
``x_t = (sigma_t/sigma_s) e^(-eta h) x_s + alpha_t (1 - e^(-(1+eta) h)) D + sigma_t sqrt(1 - e^(-2 eta h)) z``;
the solvers differ in how they correct D along the step.
"""

from __future__ import annotations

import torch

from ..protocol import Run, SamplerGen, ask
from ..trajectory import ancestral_split, half_log_snr, offset_flow_start, sigma_at, signal_scale


def _frame(sigmas: torch.Tensor, run: Run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The schedule with a flow start moved off sigma = 1, its lambdas and alphas."""
    sigmas = offset_flow_start(sigmas, run.model_sampling)
    lam = half_log_snr(sigmas, run.model_sampling.is_flow)
    return sigmas, lam, signal_scale(sigmas, lam)


def _stochastic(run: Run) -> bool:
    return run.eta > 0 and run.s_noise > 0


def dpmpp_multistep_sde(
    x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, order: int = 2, heun: bool = False
) -> SamplerGen:
    """DPM-Solver++(2M) SDE (midpoint or heun correction) and (3M) SDE: the exact step plus corrections
    from the differences of the last two or three predictions."""
    if len(sigmas) <= 1:
        return x
    sigmas, lam, alpha = _frame(sigmas, run)
    h = lam.diff()
    eta = run.eta
    past: list[tuple[torch.Tensor, torch.Tensor]] = []  # (prediction, h) of the last steps, newest first
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        if target == 0:
            x = denoised
            continue
        h_eta = h[i] * (eta + 1)
        kept = -torch.expm1(-h_eta)  # 1 - e^(-(1+eta) h)
        x = target / sigma * (-h[i] * eta).exp() * x + alpha[i + 1] * kept * denoised
        if order == 2 and past:
            change = (denoised - past[0][0]) / (past[0][1] / h[i])
            weight = (kept / -h_eta + 1) if heun else 0.5 * kept
            x = x + alpha[i + 1] * weight * change
        elif order == 3 and past:
            phi2 = torch.expm1(-h_eta) / h_eta + 1
            r0 = past[0][1] / h[i]
            slope0 = (denoised - past[0][0]) / r0
            if len(past) == 1:
                x = x + (alpha[i + 1] * phi2) * slope0
            else:
                r1 = past[1][1] / h[i]
                slope1 = (past[0][0] - past[1][0]) / r1
                first = slope0 + (slope0 - slope1) * r0 / (r0 + r1)
                second = (slope0 - slope1) / (r0 + r1)
                phi3 = phi2 / h_eta - 0.5
                x = x + (alpha[i + 1] * phi2) * first - (alpha[i + 1] * phi3) * second
        if _stochastic(run):
            x = x + run.draw(sigma, target, x) * target * (-torch.expm1(-2 * h[i] * eta)).sqrt() * run.s_noise
        past = [(denoised, h[i]), *past][: order - 1]
    return x


def dpmpp_sde(x: torch.Tensor, sigmas: torch.Tensor, run: Run, r: float = 0.5) -> SamplerGen:
    """DPM-Solver++ SDE with two stages: an ancestral half step to lambda_s + r h, then the full step
    with the predictions mixed ``(1 - 1/2r) D + (1/2r) D_r``."""
    if len(sigmas) <= 1:
        return x
    flow = run.model_sampling.is_flow
    sigmas, lam, alpha = _frame(sigmas, run)
    mix = 1 / (2 * r)
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        if target == 0:
            x = denoised
            continue
        lam_s, lam_t = lam[i], lam[i + 1]
        lam_mid = lam_s + r * (lam_t - lam_s)
        sigma_mid = sigma_at(lam_mid, flow)
        alpha_mid = sigma_mid * lam_mid.exp()
        down, up = ancestral_split(lam_s.neg().exp(), lam_mid.neg().exp(), run.eta)
        h_down = down.log().neg() - lam_s
        x_mid = (alpha_mid / alpha[i]) * (-h_down).exp() * x - alpha_mid * (-h_down).expm1() * denoised
        if _stochastic(run):
            x_mid = x_mid + alpha_mid * run.draw(sigma, sigma_mid, x) * run.s_noise * up
        denoised_mid = yield from ask(x_mid, sigma_mid, i, 1)
        down, up = ancestral_split(lam_s.neg().exp(), lam_t.neg().exp(), run.eta)
        h_down = down.log().neg() - lam_s
        estimate = (1 - mix) * denoised + mix * denoised_mid
        x = (alpha[i + 1] / alpha[i]) * (-h_down).exp() * x - alpha[i + 1] * (-h_down).expm1() * estimate
        if _stochastic(run):
            x = x + alpha[i + 1] * run.draw(sigma, target, x) * run.s_noise * up
    return x


def _exp_phi1(z: torch.Tensor) -> torch.Tensor:
    return torch.expm1(z)  # z phi_1(z)


def _exp_phi2(z: torch.Tensor) -> torch.Tensor:
    return (torch.expm1(z) - z) / z  # z phi_2(z)


def seeds(x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, stages: int = 2) -> SamplerGen:
    """SEEDS-2 (stage at r = 1/2) and SEEDS-3 (stages at 1/3 and 2/3): exponential Runge-Kutta stages in
    lambda whose noise is one Brownian path carried from stage to stage."""
    flow = run.model_sampling.is_flow
    sigmas, lam, alpha = _frame(sigmas, run)
    fractions = (0.5,) if stages == 2 else (1.0 / 3, 2.0 / 3)
    eta, noisy = run.eta, _stochastic(run)
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        if target == 0:
            x = denoised
            continue
        h = lam[i + 1] - lam[i]
        h_eta = h * (eta + 1)
        predictions, path, previous_r, previous_sigma = [denoised], None, 0.0, sigma
        for k, r in enumerate(fractions):
            lam_k = torch.lerp(lam[i], lam[i + 1], r)
            sigma_k = sigma_at(lam_k, flow)
            if k == 0:
                combined = _exp_phi1(-r * h_eta) * denoised
            else:  # seeds_3's second stage
                second = r / fractions[0] * _exp_phi2(-r * h_eta)
                combined = (_exp_phi1(-r * h_eta) - second) * denoised + second * predictions[1]
            x_k = sigma_k / sigma * (-r * h * eta).exp() * x - sigma_k * lam_k.exp() * combined
            if noisy:
                path = _carry(path, (previous_r - r) * h * eta, run.draw(previous_sigma, sigma_k, x))
                x_k = x_k + path * sigma_k * run.s_noise
            predictions.append((yield from ask(x_k, sigma_k, i, k + 1)))
            previous_r, previous_sigma = r, sigma_k
        if stages == 2:
            combined = _exp_phi1(-h_eta) * torch.lerp(denoised, predictions[1], 1 / (2 * fractions[0]))
        else:
            last = _exp_phi2(-h_eta) / fractions[1]
            combined = (_exp_phi1(-h_eta) - last) * denoised + last * predictions[2]
        x = target / sigma * (-h * eta).exp() * x - alpha[i + 1] * combined
        if noisy:
            path = _carry(path, (previous_r - 1) * h * eta, run.draw(previous_sigma, target, x))
            x = x + path * target * run.s_noise
    return x


def _carry(path: torch.Tensor | None, decay: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The noise path decayed by ``e^decay`` plus fresh noise of the variance it lost (decay <= 0)."""
    fresh = (2 * decay).expm1().neg().sqrt() * z
    return fresh if path is None else path * decay.exp() + fresh


ER_SDE_POINTS = 200
"""Right Riemann sums of ER-SDE's stage integrals use this many points."""


def _er_noise_scale(rho: torch.Tensor) -> torch.Tensor:
    return rho * ((rho**0.3).exp() + 10.0)


def er_sde(x: torch.Tensor, sigmas: torch.Tensor, run: Run, max_stage: int = 3) -> SamplerGen:
    """ER-SDE-Solver-3 in rho = sigma / alpha with the noise scale ``S(rho) = rho (e^(rho^0.3) + 10)``."""
    sigmas, lam, _ = _frame(sigmas, run)
    rho = lam.neg().exp()
    points = torch.arange(0, ER_SDE_POINTS, dtype=torch.float32, device=x.device)
    earlier: torch.Tensor | None = None
    earlier_slope: torch.Tensor | None = None
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        stage = min(max_stage, i + 1)
        if target != 0:
            rho_s, rho_t = rho[i], rho[i + 1]
            a_s, a_t = sigma / rho_s, target / rho_t
            ratio = _er_noise_scale(rho_t) / _er_noise_scale(rho_s)
            x = a_t / a_s * ratio * x + a_t * (1 - ratio) * denoised
            if stage >= 2:
                d_rho = rho_t - rho_s
                width = -d_rho / ER_SDE_POINTS
                nodes = rho_t + points * width
                scaled = _er_noise_scale(nodes)
                slope = (denoised - earlier) / (rho_s - rho[i - 1])
                x = x + a_t * (d_rho + torch.sum(1 / scaled) * width * _er_noise_scale(rho_t)) * slope
                if stage >= 3:
                    curvature = (slope - earlier_slope) / ((rho_s - rho[i - 2]) / 2)
                    moment = torch.sum((nodes - rho_s) / scaled) * width
                    x = x + a_t * ((d_rho**2) / 2 + moment * _er_noise_scale(rho_t)) * curvature
                earlier_slope = slope
            if run.s_noise > 0:
                spread = (rho_t**2 - rho_s**2 * ratio**2).sqrt().nan_to_num(nan=0.0)
                x = x + a_t * run.draw(sigma, target, x) * run.s_noise * spread
        else:
            x = denoised
        earlier = denoised
    return x
